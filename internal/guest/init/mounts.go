package initproc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/corral-dev/corral/internal/guest/initproto"
	"golang.org/x/sys/unix"
)

// maskedPaths are hidden inside the sandbox: Docker's default list plus the
// /proc/kpage* files that leak physical page state (rowhammer and
// side-channel helpers). Files get /dev/null bound over them, directories an
// empty read-only tmpfs.
var maskedPaths = []string{
	// init's own fd, fdinfo and map_files listings (the targets are already
	// unreadable: init is non-dumpable).
	"/proc/1/fd",
	"/proc/1/fdinfo",
	"/proc/1/map_files",
	"/proc/asound",
	"/proc/acpi",
	"/proc/interrupts",
	"/proc/kcore",
	"/proc/keys",
	"/proc/latency_stats",
	"/proc/timer_list",
	"/proc/timer_stats",
	"/proc/sched_debug",
	"/proc/scsi",
	"/proc/kpagecgroup",
	"/proc/kpageflags",
	"/proc/kpagecount",
	"/sys/firmware",
	"/sys/devices/virtual/powercap",
	// Block devices: the node's loop devices name their backing files,
	// other sandboxes' disk images (and so their ids).
	"/sys/block",
	"/sys/class/block",
	"/sys/devices/virtual/block",
}

// readonlyPaths are Docker's read-only /proc paths.
var readonlyPaths = []string{
	"/proc/bus",
	"/proc/fs",
	"/proc/irq",
	"/proc/sys",
	"/proc/sysrq-trigger",
}

// devNodes are the host's character devices a sandbox gets in /dev.
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// buildRoot attaches the root overlay the node made, mounts the API
// filesystems into it, then pivots into it. Init started in the rootfs
// directory (as a host uid without rights on the node's run directory, it
// could not walk there); mounts is the overlay. In a user
// namespace /proc and /sys may only be mounted while the host's are
// visible (the kernel refuses to reveal more than the mount namespace
// already shows), and device nodes cannot be made, only bound from the
// host's /dev: so all of it happens before pivot_root, relative to the new
// root as working directory.
func buildRoot(cfg *initproto.Config, mounts []int) error {
	unix.Umask(0)
	defer unix.Umask(0o022)
	want := 1
	if cfg.ResolvConf {
		want++
	}
	api := hostAPI
	if cfg.Sysfs {
		api.sysMount = mounts[want]
		want++
	}
	if len(mounts) != want {
		return fmt.Errorf("root: got %d mounts, want %d (the overlay, then resolv.conf and sysfs if networked)", len(mounts), want)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / rprivate: %w", err)
	}
	if err := attachRoot(mounts[0]); err != nil {
		return fmt.Errorf("root overlay: %w", err)
	}
	if err := mountShell(".", cfg.Shell); err != nil {
		return err
	}
	if cfg.ResolvConf {
		if err := mountResolvConf(".", mounts[1]); err != nil {
			return err
		}
	}
	if err := mountAPIFS(".", api); err != nil {
		return err
	}
	if err := maskPaths("."); err != nil {
		return err
	}
	if err := pivot(); err != nil {
		return err
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	if cfg.ResolvConf {
		// A networked sandbox's namespace comes from the node, wired
		// (loopback up) and owned by the node's user namespace.
		return nil
	}
	return loopbackUp()
}

// attachRoot moves the detached mount m (closed here) onto the working
// directory and makes the mount's root the working directory.
func attachRoot(m int) error {
	defer unix.Close(m)
	if err := unix.MoveMount(m, "", unix.AT_FDCWD, ".", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	if err := unix.Fchdir(m); err != nil {
		return fmt.Errorf("chdir into the new root: %w", err)
	}
	return nil
}

// attach moves the detached mount fd onto dir and closes fd.
func attach(fd int, dir string) error {
	defer unix.Close(fd)
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount to %s: %w", dir, err)
	}
	return nil
}

// pivot makes the working directory the root and detaches the old one.
func pivot() error {
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("pivot_root: detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("pivot_root: chdir /: %w", err)
	}
	return nil
}

type mnt struct {
	src, dst, fstype string
	flags            uintptr
	data             string
}

// apiSource says where mountAPIFS takes /proc, /sys and the device nodes
// from: fresh proc and sysfs mounts and the host's /dev while the host's
// mounts are still visible (before pivot_root), or binds of init's own
// templates of them (pool views, made after pivot_root).
// sysMount, when set, is a detached sysfs to attach instead.
type apiSource struct {
	proc, sys, dev string
	sysMount       int
}

var (
	hostAPI = apiSource{dev: "/dev"}
	poolAPI = apiSource{proc: poolProc, sys: poolSys, dev: poolDev}
)

// mountAPIFS mounts /proc, /dev and friends under root ("" for /).
func mountAPIFS(root string, src apiSource) error {
	const nse = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := mountAt(sourced(mnt{"proc", root + "/proc", "proc", nse, ""}, src.proc)); err != nil {
		return err
	}
	if err := mountAt(mnt{"tmpfs", root + "/dev", "tmpfs", unix.MS_NOSUID | unix.MS_STRICTATIME, "mode=755,size=65536k"}); err != nil {
		return err
	}
	if err := makeDev(root, src.dev); err != nil {
		return err
	}
	for _, m := range []mnt{
		{"devpts", root + "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"},
		{"shm", root + "/dev/shm", "tmpfs", nse, "mode=1777,size=65536k"},
	} {
		if err := mountAt(m); err != nil {
			return err
		}
	}
	if src.sysMount > 0 {
		if err := os.MkdirAll(root+"/sys", 0o755); err != nil {
			return fmt.Errorf("mount sysfs: %w", err)
		}
		return attach(src.sysMount, root+"/sys")
	}
	return mountAt(sourced(mnt{"sysfs", root + "/sys", "sysfs", nse | unix.MS_RDONLY, ""}, src.sys))
}

// sourced turns m into a bind of template when there is one; mountAt then
// makes the bind read-only if m asks for MS_RDONLY.
func sourced(m mnt, template string) mnt {
	if template == "" {
		return m
	}
	return mnt{template, m.dst, "", unix.MS_BIND | m.flags, ""}
}

func mountAt(m mnt) error {
	if err := os.MkdirAll(m.dst, 0o755); err != nil {
		return fmt.Errorf("mount %s: %w", m.dst, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(m.dst, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("mount %s: not a directory", m.dst)
	}
	if err := unix.Mount(m.src, m.dst, m.fstype, m.flags, m.data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", m.src, m.dst, err)
	}
	if m.flags&unix.MS_BIND != 0 && m.flags&unix.MS_RDONLY != 0 {
		if err := unix.Mount("", m.dst, "", m.flags|unix.MS_REMOUNT, ""); err != nil {
			return fmt.Errorf("mount %s read-only: %w", m.dst, err)
		}
	}
	return nil
}

// makeDev binds the device nodes of devDir (the host's /dev or init's
// template) onto empty files under root/dev: a user namespace may not make
// device nodes, and a tmpfs mounted in one refuses to open them.
func makeDev(root, devDir string) error {
	for _, d := range devNodes {
		if err := bindFile(devDir+"/"+d, root+"/dev/"+d); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, root+"/dev/"+name); err != nil {
			return fmt.Errorf("symlink /dev/%s: %w", name, err)
		}
	}
	return nil
}

// bindFile binds the file src onto a new empty file dst.
func bindFile(src, dst string) error {
	fd, err := unix.Open(dst, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o666)
	if err != nil {
		return fmt.Errorf("bind %s: create %s: %w", src, dst, err)
	}
	unix.Close(fd)
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, dst, err)
	}
	return nil
}

// maskPaths masks and write-protects /proc and /sys paths under root.
func maskPaths(root string) error {
	for _, p := range maskedPaths {
		p = root + p
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			continue // absent on this kernel
		}
		var err error
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY, "size=0")
		} else {
			err = unix.Mount(root+"/dev/null", p, "", unix.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range readonlyPaths {
		p = root + p
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("read-only %s: %w", p, err)
		}
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
		if err := unix.Mount(p, p, "", flags, ""); err != nil {
			return fmt.Errorf("read-only %s: %w", p, err)
		}
	}
	return nil
}

// loopbackUp brings lo up; the network namespace has nothing else.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: get flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: set flags: %w", err)
	}
	return nil
}

// mountShell puts the static shell src (the node's, or init's template of
// it in pool mode) at initproto.ShellPath under root: a read-only bind of
// the file on a file of a tiny tmpfs, itself remounted read-only. The
// directory is a mount point, so from inside it can be neither written,
// renamed, removed nor mounted over. An empty src mounts nothing.
func mountShell(root, src string) error {
	if src == "" {
		return nil
	}
	dir := root + filepath.Dir(initproto.ShellPath)
	file := root + initproto.ShellPath
	steps := []struct {
		what string
		do   func() error
	}{
		{"make dir", func() error { return ignoreExist(unix.Mkdir(dir, 0o755)) }},
		{"check dir", func() error {
			// Still the host's view of paths: an image's symlink here
			// would point the mount at a host directory.
			var st unix.Stat_t
			if err := unix.Lstat(dir, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return fmt.Errorf("%s is not a directory", initproto.ShellPath)
			}
			return nil
		}},
		{"mount tmpfs", func() error {
			return unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64k,mode=0755")
		}},
		{"make file", func() error {
			fd, err := unix.Open(file, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o755)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}},
		{"bind", func() error { return unix.Mount(src, file, "", unix.MS_BIND, "") }},
		{"bind read-only", func() error {
			return unix.Mount("", file, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
		}},
		{"tmpfs read-only", func() error {
			return unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "size=64k,mode=0755")
		}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			return fmt.Errorf("mount shell %s: %s: %w", src, st.what, err)
		}
	}
	return nil
}

// mountResolvConf attaches m, the node's resolv.conf as a detached
// read-only mount, over /etc/resolv.conf (closing m), so that every resolver library asks the node's DNS
// proxy. It is convenience, not enforcement: the eBPF programs refuse any
// other resolver whatever the file says. A symlink in the image (Debian's
// points into /run) is replaced by a file in the sandbox's upper layer
// first, never followed.
func mountResolvConf(root string, m int) error {
	defer unix.Close(m)
	etc := filepath.Join(root, "etc")
	file := filepath.Join(etc, "resolv.conf")
	steps := []struct {
		what string
		do   func() error
	}{
		{"make /etc", func() error { return ignoreExist(unix.Mkdir(etc, 0o755)) }},
		{"check /etc", func() error {
			var st unix.Stat_t
			if err := unix.Lstat(etc, &st); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return fmt.Errorf("/etc is not a directory")
			}
			return nil
		}},
		{"replace a symlink", func() error {
			var st unix.Stat_t
			if err := unix.Lstat(file, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return unix.Unlink(file)
			}
			return nil
		}},
		{"make file", func() error {
			fd, err := unix.Open(file, unix.O_CREAT|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}},
		{"attach", func() error {
			return unix.MoveMount(m, "", unix.AT_FDCWD, file, unix.MOVE_MOUNT_F_EMPTY_PATH)
		}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			return fmt.Errorf("mount resolv.conf: %s: %w", st.what, err)
		}
	}
	return nil
}

func ignoreExist(err error) error {
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}
