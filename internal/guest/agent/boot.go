// Package agent is corral-agent, PID 1 of a microVM guest: it loads the
// kernel modules the guest needs, builds the sandbox's root filesystem
// (read-only EROFS layers on virtio block devices under an overlay whose
// upper layer is an ext4 disk), switches into it and serves the node's
// exec and file requests (internal/guest/agentproto) over a virtio-serial port or
// vsock. It writes diagnostics only to the kernel console (/dev/console,
// a file on the node) and never to a file inside the guest.
//
// In a full VM (the vm backend's images) it is instead a system service
// (Service, `corral-agent --service`): the guest's init owns mounts and
// orphans, and the agent only serves its port; its diagnostics go to
// stderr (the guest's journal) and carry no secret.
//
// It imports agentproto, safefs, errdefs, guest/exec and the backend types
// only.
package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// Paths of the guest, shared with the node's initramfs builder.
const (
	ConfigPath  = agentproto.ConfigPath
	BusyboxPath = agentproto.BusyboxPath
	ShellPath   = agentproto.ShellPath
)

// console is the kernel console: the node keeps it in a file of the
// sandbox's run dir, out of the guest's filesystem.
var console = os.Stderr

func logf(format string, args ...any) {
	fmt.Fprintf(console, "corral-agent: "+format+"\n", args...)
}

// Main runs the agent; it never returns (PID 1 must not exit).
func Main() {
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		console = f
	}
	// Commands running as an unprivileged guest user cannot ptrace the
	// agent or read its memory (the secret); guest root still could.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	cfg, err := boot()
	if err != nil {
		logf("boot failed: %v", err)
		halt()
	}
	logf("serve: %v", serve(cfg))
	halt()
}

// halt reboots the guest, which ends the VM (the VMM runs with -no-reboot
// or reboot=k).
func halt() {
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	for {
		time.Sleep(time.Hour)
	}
}

// boot prepares the guest and returns the config with an open channel.
func boot() (*runtimeConfig, error) {
	if err := mountEarly(); err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(ConfigPath)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var fc agentproto.FileConfig
	if err := json.Unmarshal(raw, &fc); err != nil {
		return nil, fmt.Errorf("decode config: %w", err)
	}
	// The secret must not outlive this read anywhere a command could look.
	if err := os.Remove(ConfigPath); err != nil {
		return nil, fmt.Errorf("remove config: %w", err)
	}
	if err := loadModules(fc.Modules); err != nil {
		return nil, err
	}
	ch, err := openChannel(&fc)
	if err != nil {
		return nil, err
	}
	if err := configureNetwork(fc.Network); err != nil {
		return nil, err
	}
	if err := buildRoot(&fc); err != nil {
		return nil, err
	}
	if fc.Hostname != "" {
		_ = unix.Sethostname([]byte(fc.Hostname))
	}
	if err := dropBounding(); err != nil {
		return nil, err
	}
	return &runtimeConfig{secret: fc.Secret, channel: ch}, nil
}

func mountEarly() error {
	for _, m := range []struct{ src, dst, fstype string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil && err != unix.EBUSY {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	return nil
}

// loadModules loads each module file with finit_module, passing it the
// "<module>.<param>=..." words of the kernel command line (which modprobe
// would do): Firecracker describes its virtio-mmio devices that way.
func loadModules(paths []string) error {
	cmdline, _ := os.ReadFile("/proc/cmdline")
	for _, p := range paths {
		name := strings.ReplaceAll(strings.TrimSuffix(filepath.Base(p), ".ko"), "-", "_")
		var params []string
		for _, w := range strings.Fields(string(cmdline)) {
			mod, param, ok := strings.Cut(w, ".")
			if ok && strings.ReplaceAll(mod, "-", "_") == name && strings.Contains(param, "=") {
				params = append(params, param)
			}
		}
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("module %s: %w", p, err)
		}
		err = unix.FinitModule(int(f.Fd()), strings.Join(params, " "), 0)
		f.Close()
		if err != nil && err != unix.EEXIST {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return nil
}

// diskBySerial waits for the virtio block device whose serial is serial.
func diskBySerial(serial string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		ents, _ := os.ReadDir("/sys/block")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "serial"))
			if err == nil && string(bytes.TrimSpace(b)) == serial {
				return "/dev/" + e.Name(), nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no block device with serial %q after %v", serial, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// buildRoot mounts the layers and the disk, stacks the overlay, mounts the
// API filesystems and the shell in it, frees the initramfs and switches
// into the new root.
func buildRoot(fc *agentproto.FileConfig) error {
	var lower []string
	for i, l := range fc.Layers {
		dev, err := diskBySerial(l.Image, 10*time.Second)
		if err != nil {
			return err
		}
		var opts []string
		for _, extra := range l.Devices {
			d, err := diskBySerial(extra, 10*time.Second)
			if err != nil {
				return err
			}
			opts = append(opts, "device="+d)
		}
		dir := fmt.Sprintf("/layers/%d", i)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(dev, dir, "erofs", unix.MS_RDONLY|unix.MS_NODEV, strings.Join(opts, ",")); err != nil {
			return fmt.Errorf("mount layer %d (%s): %w", i, dev, err)
		}
		lower = append(lower, dir)
	}
	disk, err := diskBySerial(fc.Disk, 10*time.Second)
	if err != nil {
		return err
	}
	if err := os.MkdirAll("/disk", 0o755); err != nil {
		return err
	}
	if err := unix.Mount(disk, "/disk", "ext4", unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mount disk %s: %w", disk, err)
	}
	for _, d := range []string{"/disk/upper", "/disk/work", "/newroot"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// xino=on: EROFS lowers and the ext4 upper are different filesystems;
	// without it readdir's d_ino and stat's st_ino disagree for directories.
	opts := fmt.Sprintf("lowerdir=%s,upperdir=/disk/upper,workdir=/disk/work,xino=on", strings.Join(lower, ":"))
	if err := unix.Mount("overlay", "/newroot", "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay: %w", err)
	}
	if err := mountAPIFS("/newroot"); err != nil {
		return err
	}
	resolv := ""
	if fc.Network != nil {
		resolv = fc.Network.ResolvConf
	}
	if err := mountShell("/newroot", resolv); err != nil {
		return err
	}
	return switchRoot("/newroot")
}

func mountAPIFS(root string) error {
	for _, m := range []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}{
		{"proc", "proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", "sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_RDONLY, ""},
		{"devtmpfs", "dev", "devtmpfs", unix.MS_NOSUID, ""},
		{"devpts", "dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620"},
		{"tmpfs", "dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	} {
		dst := filepath.Join(root, m.dst)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", dst, err)
		}
		if err := unix.Mount(m.src, dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s: %w", dst, err)
		}
	}
	// Sysctls read-only: core_pattern or modprobe pointing at a guest file
	// would make the kernel run it with every capability, around the
	// bounding set commands get (see dropBounding).
	sys := filepath.Join(root, "proc/sys")
	if err := unix.Mount(sys, sys, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", sys, err)
	}
	if err := unix.Mount("", sys, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("remount %s read-only: %w", sys, err)
	}
	return nil
}

// mountShell bind-mounts the initramfs's static busybox read-only at
// ShellPath, on a read-only tmpfs of its own, so that shell execs do not
// run the image's /bin/sh. A networked guest's resolv.conf is kept in the
// same tmpfs and bound read-only over /etc/resolv.conf: every resolver asks
// the node's DNS proxy, the only DNS server its policy lets it reach.
func mountShell(root, resolv string) error {
	dir := filepath.Join(root, filepath.Dir(ShellPath))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64k,mode=755"); err != nil {
		return fmt.Errorf("mount %s: %w", dir, err)
	}
	dst := filepath.Join(root, ShellPath)
	if err := os.WriteFile(dst, nil, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(BusyboxPath, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind shell: %w", err)
	}
	ro := []string{dst, dir}
	if resolv != "" {
		src := filepath.Join(dir, "resolv.conf")
		if err := os.WriteFile(src, []byte(resolv), 0o644); err != nil {
			return err
		}
		etc := filepath.Join(root, "etc", "resolv.conf")
		// A symlink (systemd-resolved's stub) would be followed by the
		// bind: a regular file of the upper layer takes its place.
		if st, err := os.Lstat(etc); err != nil || !st.Mode().IsRegular() {
			_ = os.Remove(etc)
			if err := os.MkdirAll(filepath.Dir(etc), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(etc, nil, 0o644); err != nil {
				return err
			}
		}
		if err := unix.Mount(src, etc, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind resolv.conf: %w", err)
		}
		ro = append(ro, etc)
	}
	for _, p := range ro {
		if err := unix.Mount("", p, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("remount %s read-only: %w", p, err)
		}
	}
	return nil
}

// switchRoot frees the initramfs (its files are in RAM) and makes root the
// guest's "/", as switch_root does: the initramfs cannot be pivoted away.
func switchRoot(root string) error {
	ents, err := os.ReadDir("/")
	if err != nil {
		return err
	}
	for _, e := range ents {
		switch e.Name() {
		case "dev", "proc", "sys", "layers", "disk", "newroot":
			continue
		}
		_ = os.RemoveAll("/" + e.Name())
	}
	for _, m := range []string{"/dev", "/proc", "/sys"} {
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.Mount(root, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}
