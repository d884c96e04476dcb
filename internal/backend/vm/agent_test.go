package vm

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// TestVMAgentService: a built image carries corral-agent; it runs as a
// systemd service (not PID 1) and serves exec with output streamed while
// the command runs.
func TestVMAgentService(t *testing.T) {
	b, sb := sharedVM(t)
	im, err := b.images.Get(testRef)
	if err != nil {
		t.Fatal(err)
	}
	if !im.Agent || sb.agent == nil {
		t.Fatalf("image agent=%v, sandbox agent=%v: a built image must carry corral-agent and the sandbox use it", im.Agent, sb.agent != nil)
	}
	if out := sh(t, sb, "cat /proc/1/comm; systemctl is-active corral-agent; cat /proc/$PPID/comm"); out != "systemd\nactive\ncorral-agent\n" {
		t.Errorf("pid 1, agent service, parent of the command: %q", out)
	}
	// The first line arrives while the command still runs.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	var out bytes.Buffer
	first := make(chan time.Time, 1)
	start := time.Now()
	res, err := sb.Exec(ctx, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "echo first; sleep 3; echo second"},
		Env: []string{"PATH=/usr/bin:/bin"}}, func(_ backend.Stream, p []byte) error {
		mu.Lock()
		defer mu.Unlock()
		if out.Len() == 0 {
			first <- time.Now()
		}
		out.Write(p)
		return nil
	})
	end := time.Now()
	if err != nil || res.ExitCode != 0 || out.String() != "first\nsecond\n" {
		t.Fatalf("exec: %+v %v %q", res, err, out.String())
	}
	if got := <-first; end.Sub(got) < 2*time.Second {
		t.Errorf("first output %v after start, command ended %v after start: output was not streamed", got.Sub(start), end.Sub(start))
	}
}

// TestVMAgentSecret: the secret reaches the guest through fw_cfg,
// readable by guest root only, and the agent refuses a request without it.
func TestVMAgentSecret(t *testing.T) {
	_, sb := sharedVM(t)
	const fwcfg = "/sys/firmware/qemu_fw_cfg/by_name/" + agentSecretName + "/raw"
	if got := sh(t, sb, "cat "+fwcfg); got != sb.m.Secret {
		t.Errorf("fw_cfg secret %q, want the sandbox's", got)
	}
	res, _, stderr := run(t, sb, backend.ExecSpec{Argv: []string{"cat", fwcfg}, User: "65534:65534"})
	if res.ExitCode == 0 || !strings.Contains(stderr, "Permission denied") {
		t.Errorf("guest user nobody read the secret: %+v %q", res, stderr)
	}
	// QEMU serves one client on the port's socket: the sandbox's own
	// session makes way, and its next call dials again.
	sb.agent.close()
	bad := newAgentConn(sb.m.path(agentSock), strings.Repeat("0", len(sb.m.Secret)), sb.m.PortHandshake)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := bad.Call(ctx, agentproto.Request{Op: agentproto.OpPing})
	bad.close()
	if !errdefs.IsPermissionDenied(err) {
		t.Errorf("ping with a wrong secret: %v, want permission denied", err)
	}
	if out := sh(t, sb, "echo ok"); out != "ok\n" {
		t.Errorf("after the refused session: %q", out)
	}
}

// TestVMAgentRedial: the node drops its session and dials again at once,
// over and over (a daemon restart, a snapshot's detach); the guest may
// still be serving the old session when the new one's frames arrive, and
// every call after each redial must still be answered.
func TestVMAgentRedial(t *testing.T) {
	_, sb := sharedVM(t)
	for i := range 20 {
		sb.agent.close()
		if out := sh(t, sb, fmt.Sprintf("echo %d", i)); out != fmt.Sprintf("%d\n", i) {
			t.Fatalf("redial %d: %q", i, out)
		}
	}
}

// qgaView is the shared VM as a sandbox without corral-agent: the same
// guest through qemu-ga, the path of images without the agent.
func qgaView(t *testing.T, sb *sandbox) *sandbox {
	t.Helper()
	q := &sandbox{Lifecycle: sb.Lifecycle, b: sb.b, m: sb.m, qga: sb.qga}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := q.waitAgent(ctx, time.Minute); err != nil {
		t.Fatalf("qemu-ga: %v", err)
	}
	return q
}

// TestVMGuestAgentFallback: without corral-agent, exec and files go
// through qemu-ga (output only once the command ended, stdin whole).
func TestVMGuestAgentFallback(t *testing.T) {
	_, sb := sharedVM(t)
	q := qgaView(t, sb)
	if !q.m.Linux {
		t.Fatal("qemu-ga view: guest not recognised as Linux")
	}
	res, stdout, _ := run(t, q, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "echo $PPID; cat /proc/$PPID/comm; cat"}, Stdin: []byte("in\n")})
	if res.ExitCode != 0 || !strings.Contains(stdout, "in\n") || strings.Contains(stdout, "corral-agent") {
		t.Errorf("exec through qemu-ga: %+v %q", res, stdout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := q.WriteFile(ctx, "/root/qga.txt", strings.NewReader("via qga"), backend.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Read back through corral-agent: both serve the same guest.
	r, err := sb.ReadFile(ctx, "/root/qga.txt", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(r)
	r.Close()
	if err != nil || string(b) != "via qga" {
		t.Errorf("read back: %q %v", b, err)
	}
}

// TestVMTree: a tar stream goes into the guest (owners, modes, a symlink)
// and comes back out through corral-agent.
func TestVMTree(t *testing.T) {
	_, sb := sharedVM(t)
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	for _, h := range []tar.Header{
		{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o750, Uid: 1000, Gid: 1000},
		{Name: "d/f.txt", Typeflag: tar.TypeReg, Mode: 0o640, Size: 5, Uid: 1000, Gid: 1000},
		{Name: "d/link", Typeflag: tar.TypeSymlink, Linkname: "f.txt"},
	} {
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte("hello"))
		}
	}
	tw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	entries, n, err := sb.CopyIn(ctx, "/root/tree", &in)
	if err != nil || entries != 3 || n != 5 {
		t.Fatalf("copy in: %d entries, %d bytes, %v", entries, n, err)
	}
	if got := sh(t, sb, "cd /root/tree/d && stat -c '%a %u:%g' . f.txt && readlink link && cat link"); got != "750 1000:1000\n640 1000:1000\nf.txt\nhello" {
		t.Errorf("in the guest: %q", got)
	}
	var out bytes.Buffer
	if err := sb.CopyOut(ctx, "/root/tree/d", &out); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&out)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "d/f.txt" && (h.Uid != 1000 || h.Size != 5) {
			t.Errorf("copied out %s: uid %d size %d", h.Name, h.Uid, h.Size)
		}
	}
	if strings.Join(names, " ") != "d/ d/f.txt d/link" && strings.Join(names, " ") != "d/ d/link d/f.txt" {
		t.Errorf("copied out %q", names)
	}
	if err := sb.CopyOut(ctx, "/root/none", io.Discard); !errdefs.IsNotFound(err) {
		t.Errorf("copy out of a missing path: %v, want not found", err)
	}
	if _, _, err := sb.CopyIn(ctx, "/root/bad", strings.NewReader("not a tar stream at all, just text")); err == nil {
		t.Error("copy in of a non-tar stream succeeded")
	}
}
