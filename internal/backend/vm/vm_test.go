package vm

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
)

// The tests on the shared VM run in this file's order; TestVMDelete,
// which deletes it, comes last.

func TestVMExecUnameAndPython(t *testing.T) {
	_, sb := sharedVM(t)
	out := sh(t, sb, "uname -a")
	if !strings.Contains(out, "Linux") || !strings.Contains(out, "sandbox") {
		t.Errorf("uname -a = %q, want Linux on host sandbox", out)
	}
	res, out, _ := run(t, sb, backend.ExecSpec{Argv: []string{"python3", "-c", "import sys; print(sum(range(10)), sys.version_info.major)"}})
	if res.ExitCode != 0 || strings.TrimSpace(out) != "45 3" {
		t.Errorf("python3: exit %d, out %q, want 45 3", res.ExitCode, out)
	}
	// Exit codes, stdin, env, cwd and user pass through the guest agent.
	res, out, errb := run(t, sb, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", `read x; echo "$x $FOO $(pwd) $(id -u)"; echo err >&2; exit 3`},
		Stdin: []byte("in\n"), Env: []string{"PATH=/usr/bin:/bin", "FOO=bar"}, Cwd: "/tmp", User: "65534"})
	if res.ExitCode != 3 || out != "in bar /tmp 65534\n" || errb != "err\n" {
		t.Errorf("exec: exit %d out %q err %q, want 3 %q %q", res.ExitCode, out, errb, "in bar /tmp 65534\n", "err\n")
	}
	// A missing program is NotFound, as in the other backends.
	_, err := sb.Exec(context.Background(), backend.ExecSpec{Argv: []string{"/no/such"}, Env: []string{"PATH=/bin"}, Timeout: time.Minute}, func(backend.Stream, []byte) error { return nil })
	if !errdefs.IsNotFound(err) {
		t.Errorf("exec of a missing program: %v, want NotFound", err)
	}
}

func TestVMExecLimits(t *testing.T) {
	_, sb := sharedVM(t)
	res, out, _ := run(t, sb, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "head -c 100000 /dev/zero"}, OutputLimit: 1000})
	if !res.Truncated || len(out) != 1000 {
		t.Errorf("output cap: truncated %v, %d bytes, want true, 1000", res.Truncated, len(out))
	}
	res, _, _ = run(t, sb, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "sleep 1000 & sleep 1000"}, Timeout: 2 * time.Second})
	if !res.TimedOut || res.Signal != 9 {
		t.Errorf("timeout: %+v, want TimedOut by SIGKILL", res)
	}
	// The whole process group went with it.
	if out := sh(t, sb, "pgrep -c -x sleep || true"); strings.TrimSpace(out) != "0" {
		t.Errorf("sleeps left after the timeout: %s", out)
	}
}

func TestVMFiles(t *testing.T) {
	_, sb := sharedVM(t)
	ctx := context.Background()
	data := bytes.Repeat([]byte("corral\x00\xff"), 300000) // > 2 chunks, binary
	n, err := sb.WriteFile(ctx, "/root/new/dir/f.bin", bytes.NewReader(data), backend.WriteOptions{Mode: 0o600, MakeParents: true})
	if err != nil || n != int64(len(data)) {
		t.Fatalf("write: %d, %v", n, err)
	}
	rc, err := sb.ReadFile(ctx, "/root/new/dir/f.bin", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %d bytes (err %v), want %d equal bytes", len(got), err, len(data))
	}
	rc, err = sb.ReadFile(ctx, "/root/new/dir/f.bin", 8, 6)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(rc)
	rc.Close()
	if string(got) != "corral" {
		t.Errorf("read at offset 8, limit 6 = %q", got)
	}
	fi, err := sb.Stat(ctx, "/root/new/dir/f.bin")
	if err != nil || fi.Size != int64(len(data)) || fi.Mode.Perm() != 0o600 || fi.Mode.IsDir() {
		t.Errorf("stat = %+v, %v", fi, err)
	}
	if _, err := sb.WriteFile(ctx, "/root/new/dir/f.bin", strings.NewReader("+tail"), backend.WriteOptions{Append: true}); err != nil {
		t.Fatal(err)
	}
	if out := sh(t, sb, "tail -c 5 /root/new/dir/f.bin"); out != "+tail" {
		t.Errorf("append: tail %q", out)
	}
	if err := sb.MakeDir(ctx, "/root/new/dir/sub", 0o700, false); err != nil {
		t.Fatal(err)
	}
	ents, err := sb.ListDir(ctx, "/root/new/dir")
	if err != nil || len(ents) != 2 {
		t.Fatalf("list = %+v, %v", ents, err)
	}
	if _, err := sb.ReadFile(ctx, "/root/none", 0, 0); !errdefs.IsNotFound(err) {
		t.Errorf("read of a missing file: %v, want NotFound", err)
	}
	if _, err := sb.Stat(ctx, "/root/none"); !errdefs.IsNotFound(err) {
		t.Errorf("stat of a missing file: %v, want NotFound", err)
	}
	if err := sb.Remove(ctx, "/root/new", false); err == nil {
		t.Error("non-recursive remove of a full directory succeeded")
	}
	if err := sb.Remove(ctx, "/root/new", true); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Stat(ctx, "/root/new"); !errdefs.IsNotFound(err) {
		t.Errorf("stat after remove: %v, want NotFound", err)
	}
}

// bgColor is the most common colour of a screenshot (the background).
func bgColor(img image.Image) (color.Color, int) {
	counts := map[color.RGBA]int{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bb, a := img.At(x, y).RGBA()
			counts[color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(bb >> 8), uint8(a >> 8)}]++
		}
	}
	var best color.RGBA
	for c, n := range counts {
		if n > counts[best] {
			best = c
		}
	}
	return best, b.Dx()*b.Dy() - counts[best]
}

func screenshot(t *testing.T, sb *sandbox, scale float64) (image.Image, backend.Screenshot) {
	t.Helper()
	shot, err := sb.Screenshot(context.Background(), scale)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot.PNG))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if img.Bounds().Dx() != shot.Width || img.Bounds().Dy() != shot.Height {
		t.Fatalf("screenshot %dx%d, says %dx%d", img.Bounds().Dx(), img.Bounds().Dy(), shot.Width, shot.Height)
	}
	return img, shot
}

// TestVMScreenAndInput: the console shows text (the autologin shell),
// and typing a command through Input changes what it shows.
func TestVMScreenAndInput(t *testing.T) {
	_, sb := sharedVM(t)
	// The login on tty1 may come a little after the guest agent.
	var before image.Image
	for deadline := time.Now().Add(time.Minute); ; {
		img, _ := screenshot(t, sb, 0)
		if _, fg := bgColor(img); fg > 100 && strings.Contains(sh(t, sb, "who || true"), "tty1") {
			before = img
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no login on tty1 within a minute")
		}
		time.Sleep(2 * time.Second)
	}
	_, shot := screenshot(t, sb, 0.5)
	if shot.Width != before.Bounds().Dx()/2 {
		t.Errorf("scaled screenshot is %d wide, want %d", shot.Width, before.Bounds().Dx()/2)
	}
	ctx := context.Background()
	if err := sb.SendInput(ctx, []backend.InputEvent{{Text: "echo corral > /tmp/typed"}, {Keys: "enter"}}); err != nil {
		t.Fatal(err)
	}
	var typed string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		if typed = sh(t, sb, "cat /tmp/typed 2>/dev/null || true"); typed != "" {
			break
		}
	}
	if typed != "corral\n" {
		t.Fatalf("the typed command wrote %q, want corral", typed)
	}
	after, _ := screenshot(t, sb, 0)
	diff := 0
	b := after.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if after.At(x, y) != before.At(x, y) {
				diff++
			}
		}
	}
	if diff < 50 {
		t.Errorf("the screen changed in %d pixels after typing, want the typed line", diff)
	}
	// Mouse events reach the tablet without error; bad ones are refused.
	if err := sb.SendInput(ctx, []backend.InputEvent{{Click: true, X: 10, Y: 10}, {Scroll: true, X: 10, Y: 10, ScrollDelta: -2}}); err != nil {
		t.Errorf("click and scroll: %v", err)
	}
	for _, ev := range []backend.InputEvent{{Click: true, X: 100000, Y: 1}, {Keys: "ctrl-nosuchkey"}, {Text: "é"}, {}} {
		if err := sb.SendInput(ctx, []backend.InputEvent{ev}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("input %+v: %v, want InvalidArgument", ev, err)
		}
	}
	if _, err := sb.Screenshot(ctx, 2); !errdefs.IsInvalidArgument(err) {
		t.Errorf("scale 2: %v, want InvalidArgument", err)
	}
}

// TestVMPause: a paused guest's clock stands still; resumed, it runs.
func TestVMPause(t *testing.T) {
	_, sb := sharedVM(t)
	ctx := context.Background()
	uptime := func() float64 {
		f, err := strconv.ParseFloat(strings.Fields(sh(t, sb, "cat /proc/uptime"))[0], 64)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	u0 := uptime()
	start := time.Now()
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, backend.ExecSpec{Argv: []string{"true"}}, nil); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("exec while paused: %v, want FailedPrecondition", err)
	}
	time.Sleep(4 * time.Second)
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	u1 := uptime()
	wall := time.Since(start).Seconds()
	if guest := u1 - u0; guest > wall-3 {
		t.Errorf("guest uptime advanced %.1fs over %.1fs of wall time with 4s paused", guest, wall)
	}
	if u2 := uptime(); u2 <= u1 {
		t.Errorf("guest clock stands still after resume: %v then %v", u1, u2)
	}
}

// TestVMSnapshot: pausing to disk ends QEMU and frees its memory; resume
// restores the VM with its processes running and its files in place.
func TestVMSnapshot(t *testing.T) {
	b, sb := plainVM(t)
	ctx := context.Background()
	pid := strings.TrimSpace(sh(t, sb, "setsid sleep 10000 </dev/null >/dev/null 2>&1 & echo $!; echo kept > /root/kept"))
	qemu := sb.m.Pid
	start := time.Now()
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("pause to snapshot: %v", time.Since(start).Round(time.Millisecond))
	if !sb.Checkpointed() {
		t.Fatal("not checkpointed after a pause with SnapshotAfter 0")
	}
	fi, err := os.Stat(sb.m.path(snapshotFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(qemu)); err == nil {
		t.Errorf("qemu %d still runs while snapshotted", qemu)
	}
	// A restarted daemon finds the snapshotted VM as it was.
	b2, err := New(b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b2.Recover(ctx, sb.m.id, sb.Record())
	if err != nil {
		t.Fatalf("recover a snapshotted vm: %v", err)
	}
	sb = got.(*sandbox)
	plain.b, plain.sb = b2, sb
	start = time.Now()
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("restore from a %d MiB snapshot: %v", fi.Size()>>20, time.Since(start).Round(time.Millisecond))
	if out := sh(t, sb, "kill -0 "+pid+" && cat /root/kept"); out != "kept\n" {
		t.Errorf("after restore: %q, want the process alive and the file kept", out)
	}
	if _, err := os.Stat(sb.m.path(snapshotFile)); !os.IsNotExist(err) {
		t.Errorf("snapshot file left after restore: %v", err)
	}
}

// TestVMResources: the memory limit is the guest's RAM, the disk limit
// the overlay's size (the root file system grew into it).
func TestVMResources(t *testing.T) {
	_, sb := sharedVM(t)
	var kb int64
	for _, l := range strings.Split(sh(t, sb, "cat /proc/meminfo"), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	want := shared.spec.Resources.MemoryBytes >> 10
	if kb > want || kb < want*8/10 {
		t.Errorf("guest MemTotal %d KiB, want just under %d KiB", kb, want)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(2 * time.Second) {
		f := strings.Fields(strings.Split(sh(t, sb, "df -B1 --output=size /"), "\n")[1])
		size, _ := strconv.ParseInt(f[0], 10, 64)
		if size > shared.spec.Resources.DiskBytes*8/10 && size <= shared.spec.Resources.DiskBytes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("root file system %d bytes, want about the overlay's %d", size, shared.spec.Resources.DiskBytes)
		}
	}
}

// TestVMImages: import validates disks, rm refuses an image in use.
func TestVMImages(t *testing.T) {
	b, _ := sharedVM(t)
	ctx := context.Background()
	dir := t.TempDir()
	q := filepath.Join(dir, "x.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", q, "64M").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	f, _ := os.Open(q)
	im, err := b.images.Import(ctx, "blank@1", FirmwareUEFI, f)
	f.Close()
	if err != nil || im.Format != "qcow2" || im.VirtualSize != 64<<20 {
		t.Fatalf("import qcow2: %+v, %v", im, err)
	}
	raw := make([]byte, 1<<20)
	raw[510], raw[511] = 0x55, 0xaa
	if _, err := b.images.Import(ctx, "raw@1", FirmwareBIOS, bytes.NewReader(raw)); err != nil {
		t.Errorf("import raw with an MBR: %v", err)
	}
	for name, in := range map[string][]byte{"text": []byte(strings.Repeat("not a disk\n", 100)), "empty": nil, "zeros": make([]byte, 4096)} {
		if _, err := b.images.Import(ctx, "bad@"+name, FirmwareBIOS, bytes.NewReader(in)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("import %s: %v, want InvalidArgument", name, err)
		}
	}
	back := filepath.Join(dir, "backed.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-b", q, "-F", "qcow2", back).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	f, _ = os.Open(back)
	_, err = b.images.Import(ctx, "backed@1", FirmwareBIOS, f)
	f.Close()
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("import of a qcow2 with a backing file: %v, want InvalidArgument", err)
	}
	if _, err := b.images.Import(ctx, "blank@1", FirmwareBIOS, bytes.NewReader(raw)); !errdefs.IsAlreadyExists(err) {
		t.Errorf("import over an existing ref: %v, want AlreadyExists", err)
	}
	if _, err := b.images.Import(ctx, "Bad Name", FirmwareBIOS, bytes.NewReader(raw)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad name: %v", err)
	}
	if _, err := b.images.Import(ctx, "x@1", "coreboot", bytes.NewReader(raw)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad firmware: %v", err)
	}
	all, _ := b.images.List()
	if len(all) != 3 {
		t.Errorf("list: %d images, want 3 (%+v)", len(all), all)
	}
	if err := b.images.Remove(testRef); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("rm of the image the shared vm uses: %v, want FailedPrecondition", err)
	}
	if err := b.images.Remove("blank@1"); err != nil {
		t.Errorf("rm unused: %v", err)
	}
	if _, err := b.images.Get("blank@1"); !errdefs.IsNotFound(err) {
		t.Errorf("get after rm: %v", err)
	}
}

// TestVMNetwork: the guest reaches an allowed name through the node's
// DNS proxy and the slot's tap, and not a denied address.
func TestVMNetwork(t *testing.T) {
	_, sb := sharedVM(t)
	out := sh(t, sb, `python3 - <<'EOF'
import socket
def get(addr):
    try:
        s = socket.create_connection((addr, 80), timeout=6)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        return data.decode(errors="replace").strip().splitlines()[-1]
    except OSError:
        return "unreachable"
try:
    print("dns", socket.gethostbyname("pypi.test"))
except OSError:
    print("dns failed")
print("allowed", get("198.18.1.10"))
print("denied", get("198.18.1.30"))
EOF`)
	t.Logf("guest:\n%s", out)
	for _, want := range []string{"dns 198.18.1.10", "allowed lab host 198.18.1.10", "denied unreachable"} {
		if !strings.Contains(out, want) {
			t.Errorf("guest output lacks %q", want)
		}
	}
	st, err := sb.NetworkStats(context.Background())
	if err != nil || st.Total == 0 {
		t.Errorf("refusals: %+v, %v; want the denied address counted", st, err)
	}
}

// TestVMRecover: a restarted daemon (new backend, new network manager)
// re-attaches to the running VM and its guest agent.
func TestVMRecover(t *testing.T) {
	b, sb := sharedVM(t)
	// The old daemon's connections end with it (QEMU serves one client
	// per agent socket).
	sb.qga.close()
	sb.agent.close()
	if err := shared.net.Close(); err != nil {
		t.Fatal(err)
	}
	m2, err := netpolicy.NewManager(shared.netCfg)
	if err != nil {
		t.Fatal(err)
	}
	shared.net = m2
	b2, err := New(Config{RunDir: b.cfg.RunDir, ImageDir: b.cfg.ImageDir, Network: m2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	got, err := b2.Recover(ctx, sb.m.id, sb.Record())
	if err != nil {
		t.Fatalf("recover: %v", err)
	}
	shared.b, shared.sb = b2, got.(*sandbox)
	if out := sh(t, shared.sb, "cat /tmp/typed 2>/dev/null; uname -s"); !strings.Contains(out, "Linux") {
		t.Errorf("after recovery: %q", out)
	}
}

// TestVMDelete runs last: deleting the shared VM leaves no QEMU and no
// run dir (overlay, sockets) behind.
func TestVMDelete(t *testing.T) {
	b, sb := sharedVM(t)
	ctx := context.Background()
	dir := sb.m.dir
	pid := sb.m.Pid
	hostVeth := sb.m.Net.HostVeth
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Cleanup(ctx, sb.m.id, sb.Record()); err != nil {
		t.Fatal(err)
	}
	shared.sb = nil
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("run dir left: %v", err)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Errorf("qemu %d still runs", pid)
	}
	if left := b.vms.Processes(); len(left) > 0 {
		t.Errorf("qemu processes left: %v", left)
	}
	if err := b.images.Remove(testRef); err != nil {
		t.Errorf("rm of the image once unused: %v", err)
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(int(shared.lab.Node.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.LinkByName(hostVeth); err == nil {
		t.Errorf("veth %s (and so the namespace and tap) still exists after delete", hostVeth)
	}
}
