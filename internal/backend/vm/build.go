package vm

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// DebianRecipe versions what BuildDebian puts into the image; a change
// bumps it, so caches keyed by it are not reused.
const DebianRecipe = "bookworm-3"

// debianPackages are on top of mmdebstrap's minbase: the kernel and its
// initramfs, systemd, the guest agent, and what tests and agents expect
// of a small Debian (python3, ip, ps, timeout, setpriv), and Debian's CA
// bundle (OpenSSL's default store; the node adds its own CAs at boot).
var debianPackages = []string{"linux-image-amd64", "initramfs-tools", "systemd-sysv", "udev",
	"qemu-guest-agent", "python3-minimal", "kmod", "iproute2", "procps", "e2fsprogs", "ca-certificates"}

// debianExcludes keep docs and drivers no virtual machine needs out of
// the image (a third of its size).
var debianExcludes = []string{"/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/lib/firmware/*",
	"/lib/modules/*/kernel/drivers/gpu/*", "/lib/modules/*/kernel/drivers/net/wireless/*",
	"/lib/modules/*/kernel/drivers/media/*", "/lib/modules/*/kernel/sound/*",
	"/lib/modules/*/kernel/drivers/infiniband/*", "/lib/modules/*/kernel/drivers/staging/*",
	"/lib/modules/*/kernel/net/wireless/*", "/lib/modules/*/kernel/drivers/bluetooth/*",
	"/lib/modules/*/kernel/net/bluetooth/*", "/lib/modules/*/kernel/drivers/iio/*"}

// debianCmdline boots the image's root file system straight on the
// virtio disk (no partition table), kernel messages on serial and screen.
const debianCmdline = "root=/dev/vda rw console=ttyS0 console=tty0 quiet loglevel=3 panic=-1 systemd.show_status=0"

// BuildDebian builds a bootable Debian 12 image into dir (which must not
// exist) with mmdebstrap from the node's own apt sources: the root file
// system as an ext4 disk (qcow2, compressed), with the kernel and initrd
// beside it for direct boot, and the static corral-agent at agentPath
// installed as a service (see installAgent). It needs root. progress gets
// one line per phase.
func BuildDebian(ctx context.Context, dir, agentPath string, progress func(string)) (Image, error) {
	if progress == nil {
		progress = func(string) {}
	}
	for _, tool := range []string{"mmdebstrap", "mkfs.ext4", "qemu-img"} {
		if _, err := exec.LookPath(tool); err != nil {
			return Image{}, errdefs.NotSupported("vm-image build: needs %s (apt-get install mmdebstrap e2fsprogs qemu-utils)", tool)
		}
	}
	if os.Geteuid() != 0 {
		return Image{}, errdefs.NotSupported("vm-image build: needs root (mmdebstrap --mode=root)")
	}
	work, err := os.MkdirTemp(filepath.Dir(dir), ".tmp-build-")
	if err != nil {
		return Image{}, fmt.Errorf("vm-image build: %w", err)
	}
	defer os.RemoveAll(work)
	root := filepath.Join(work, "root")
	args := []string{"--variant=minbase", "--mode=root", "--include=" + strings.Join(debianPackages, ",")}
	for _, e := range debianExcludes {
		args = append(args, "--dpkgopt=path-exclude="+e)
	}
	// initramfs-tools cannot detect a root device inside the build's
	// chroot: it is told the modules the VM's root needs.
	args = append(args, `--essential-hook=mkdir -p "$1/etc/initramfs-tools/conf.d" && echo MODULES=list > "$1/etc/initramfs-tools/conf.d/corral" && printf "virtio_pci\nvirtio_blk\next4\n" >> "$1/etc/initramfs-tools/modules"`,
		"bookworm", root)
	progress("mmdebstrap: installing Debian bookworm (" + strings.Join(debianPackages, " ") + ")")
	start := time.Now()
	if err := runCmd(ctx, "mmdebstrap", args...); err != nil {
		return Image{}, fmt.Errorf("vm-image build: %w", err)
	}
	slog.Debug("vm-image build: mmdebstrap done", "took", time.Since(start))
	progress("configuring: autologin on tty1, guest agent, corral-agent, root file system growth")
	if err := customizeDebian(root); err != nil {
		return Image{}, fmt.Errorf("vm-image build: %w", err)
	}
	if err := installAgent(root, agentPath); err != nil {
		return Image{}, fmt.Errorf("vm-image build: %w", err)
	}
	out := filepath.Join(work, "out")
	if err := os.Mkdir(out, 0o700); err != nil {
		return Image{}, err
	}
	for name, glob := range map[string]string{imageKernel: "vmlinuz-*", imageInitrd: "initrd.img-*"} {
		m, _ := filepath.Glob(filepath.Join(root, "boot", glob))
		if len(m) != 1 {
			return Image{}, fmt.Errorf("vm-image build: want one /boot/%s in the image, found %d", glob, len(m))
		}
		if err := os.Rename(m[0], filepath.Join(out, name)); err != nil {
			return Image{}, fmt.Errorf("vm-image build: %w", err)
		}
	}
	used, err := duBytes(root)
	if err != nil {
		return Image{}, fmt.Errorf("vm-image build: %w", err)
	}
	// Room for the page tables of ext4 and a little writing; the guest
	// grows the file system to its overlay's size at boot.
	size := (used*5/4 + 256<<20 + 1<<20 - 1) &^ (1<<20 - 1)
	raw := filepath.Join(work, "disk.raw")
	progress(fmt.Sprintf("mkfs.ext4: %d MiB root file system", size>>20))
	if err := runCmd(ctx, "mkfs.ext4", "-q", "-F", "-L", "corral-root", "-d", root, "-E", "lazy_itable_init=1,lazy_journal_init=1", raw, strconv.FormatInt(size>>10, 10)+"k"); err != nil {
		return Image{}, fmt.Errorf("vm-image build: %w", err)
	}
	_ = os.RemoveAll(root)
	progress("qemu-img convert: compressed qcow2")
	if err := runCmd(ctx, "qemu-img", "convert", "-c", "-O", "qcow2", raw, filepath.Join(out, "disk.qcow2")); err != nil {
		return Image{}, fmt.Errorf("vm-image build: %w", err)
	}
	di, err := qemuImgInfo(ctx, filepath.Join(out, "disk.qcow2"))
	if err != nil {
		return Image{}, fmt.Errorf("vm-image build: %w", err)
	}
	fi, err := os.Stat(filepath.Join(out, "disk.qcow2"))
	if err != nil {
		return Image{}, err
	}
	im := Image{Format: "qcow2", Firmware: FirmwareDirect, Disk: "disk.qcow2", VirtualSize: di.VirtualSize,
		FileSize: fi.Size(), Cmdline: debianCmdline, Source: "vm-image build debian (" + DebianRecipe + ")", Created: time.Now().UTC(),
		Agent: true, PortHandshake: true}
	if err := os.Rename(out, dir); err != nil {
		return Image{}, fmt.Errorf("vm-image build: %w", err)
	}
	im.dir = dir
	progress(fmt.Sprintf("built in %v: %d MiB on disk, %d MiB virtual", time.Since(start).Round(time.Second), im.FileSize>>20, im.VirtualSize>>20))
	return im, nil
}

// customizeDebian configures the unpacked tree: root logs in on tty1
// without a password (the console a screen test looks at; nothing but
// the node reaches it), the root file system grows to fill its disk, and
// timers that would spend a VM's CPU in the background are masked.
func customizeDebian(root string) error {
	files := map[string]string{
		"etc/hostname": "corral-vm\n",
		"etc/fstab":    "/dev/vda / ext4 defaults,discard,errors=remount-ro 0 1\n",
		"etc/systemd/system/getty@tty1.service.d/autologin.conf": "[Service]\nExecStart=\nExecStart=-/sbin/agetty --autologin root --noclear %I $TERM\n",
		"etc/systemd/system/corral-growfs.service": "[Unit]\nDescription=Grow the root file system to its disk\n\n" +
			"[Service]\nType=oneshot\nExecStart=/sbin/resize2fs /dev/vda\n\n[Install]\nWantedBy=multi-user.target\n",
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	links := map[string]string{
		"etc/systemd/system/multi-user.target.wants/corral-growfs.service": "/etc/systemd/system/corral-growfs.service",
		"etc/systemd/system/apt-daily.timer":                               "/dev/null",
		"etc/systemd/system/apt-daily-upgrade.timer":                       "/dev/null",
		"etc/systemd/system/e2scrub_all.timer":                             "/dev/null",
		"etc/systemd/system/fstrim.timer":                                  "/dev/null",
	}
	for name, target := range links {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		_ = os.Remove(p)
		if err := os.Symlink(target, p); err != nil {
			return err
		}
	}
	shadow := filepath.Join(root, "etc/shadow")
	b, err := os.ReadFile(shadow)
	if err != nil {
		return err
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if f := strings.SplitN(l, ":", 3); len(f) == 3 && f[0] == "root" {
			lines[i] = "root::" + f[2]
		}
	}
	return os.WriteFile(shadow, []byte(strings.Join(lines, "\n")), 0o640)
}

func runCmd(ctx context.Context, name string, args ...string) error {
	var errb bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = &errb
	cmd.Stdout = &errb
	if err := cmd.Run(); err != nil {
		tail := errb.String()
		if len(tail) > 1500 {
			tail = tail[len(tail)-1500:]
		}
		return fmt.Errorf("%s: %v: %s", name, err, strings.TrimSpace(tail))
	}
	return nil
}

// duBytes sums the blocks the files under root use.
func duBytes(root string) (int64, error) {
	var total int64
	err := filepath.Walk(root, func(_ string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	return total, err
}

// Build builds the named recipe ("debian") into the store as ref.
func (s *Images) Build(ctx context.Context, recipe, ref string, progress func(string)) (Image, error) {
	if recipe != "debian" {
		return Image{}, errdefs.InvalidArgument("recipe: %q is not known (known: debian)", recipe)
	}
	if err := checkRef(ref); err != nil {
		return Image{}, err
	}
	if _, err := s.load(ref); err == nil {
		return Image{}, errdefs.AlreadyExists("vm image %s: exists (vm-image rm it first, or pick another version)", ref)
	}
	tmp, err := s.tempDir()
	if err != nil {
		return Image{}, err
	}
	defer os.RemoveAll(tmp)
	agent, err := backend.SandboxBinary(s.agentPath, "corral-agent", "vm Config.AgentPath")
	if err != nil {
		return Image{}, fmt.Errorf("vm-image build: %w", err)
	}
	out := filepath.Join(tmp, "image")
	im, err := BuildDebian(ctx, out, agent, progress)
	if err != nil {
		return Image{}, err
	}
	im.Ref = ref
	return s.install(out, im)
}

// Adopt installs a copy of an image directory BuildDebian made elsewhere
// (a cache shared by tests and benchmarks), hard-linked where it can be;
// like every image of this recipe it carries corral-agent.
func (s *Images) Adopt(src, ref string) (Image, error) {
	if err := checkRef(ref); err != nil {
		return Image{}, err
	}
	tmp, err := s.tempDir()
	if err != nil {
		return Image{}, err
	}
	defer os.RemoveAll(tmp)
	var im Image
	for _, name := range []string{"disk.qcow2", imageKernel, imageInitrd} {
		if err := linkOrCopy(filepath.Join(src, name), filepath.Join(tmp, name)); err != nil {
			return Image{}, fmt.Errorf("vm image %s: adopt: %w", ref, err)
		}
	}
	di, err := qemuImgInfo(context.Background(), filepath.Join(tmp, "disk.qcow2"))
	if err != nil {
		return Image{}, err
	}
	im = Image{Ref: ref, Format: "qcow2", Firmware: FirmwareDirect, Disk: "disk.qcow2", VirtualSize: di.VirtualSize,
		FileSize: di.ActualSize, Cmdline: debianCmdline, Source: "vm-image build debian (" + DebianRecipe + ")", Created: time.Now().UTC(),
		Agent: true, PortHandshake: true}
	return s.install(tmp, im)
}

func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	return runCmd(context.Background(), "cp", "--reflink=auto", src, dst)
}
