package initproc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/corral-dev/corral/internal/runtime/initproto"
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
}

// readonlyPaths are Docker's read-only /proc paths.
var readonlyPaths = []string{
	"/proc/bus",
	"/proc/fs",
	"/proc/irq",
	"/proc/sys",
	"/proc/sysrq-trigger",
}

type devNode struct {
	name         string
	major, minor uint32
}

var devNodes = []devNode{
	{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7},
	{"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0},
}

// buildRoot mounts the overlay, pivots into it and mounts the API
// filesystems. Everything after pivot_root resolves inside the new root, so
// symlinks in an image can never point a mount at a host path.
func buildRoot(cfg *initproto.Config) error {
	unix.Umask(0)
	defer unix.Umask(0o022)
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / rprivate: %w", err)
	}
	if err := mountOverlay(cfg); err != nil {
		return err
	}
	if err := mountShell(cfg); err != nil {
		return err
	}
	if err := mountResolvConf(cfg); err != nil {
		return err
	}
	if err := pivot(cfg.Rootfs); err != nil {
		return err
	}
	if err := mountAPIFS(""); err != nil {
		return err
	}
	if err := maskPaths(""); err != nil {
		return err
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	return loopbackUp()
}

func mountOverlay(cfg *initproto.Config) error {
	if len(cfg.Layers) == 0 {
		return errors.New("mount overlay: no layers")
	}
	if cfg.Disk != "" {
		if err := mountDisk(cfg); err != nil {
			return err
		}
	}
	for _, p := range append(append([]string{}, cfg.Layers...), cfg.UpperDir, cfg.WorkDir) {
		if strings.ContainsAny(p, ",:") {
			return fmt.Errorf("mount overlay: path %q contains ',' or ':'", p)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s",
		strings.Join(cfg.Layers, ":"), cfg.UpperDir, cfg.WorkDir)
	if len(opts) >= 4096 {
		return fmt.Errorf("mount overlay: options of %d bytes exceed a page (too many or too long layer paths)", len(opts))
	}
	if err := unix.Mount("overlay", cfg.Rootfs, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay: %w", err)
	}
	return nil
}

// diskFlags and diskOpts mount the sandbox's disk. noinit_itable: the inode
// tables of the fresh filesystem are flagged uninitialised, so the kernel
// need not zero them (which would also fill the sparse image).
const (
	diskFlags = unix.MS_NOSUID | unix.MS_NODEV
	diskOpts  = "noinit_itable"
)

// mountDisk mounts the ext4 disk on cfg.DiskDir and points cfg's upper and
// work dirs into it. / is rprivate by now: the mount exists only in this
// namespace, and goes (with the loop device, which has autoclear) when the
// namespace's last process does.
func mountDisk(cfg *initproto.Config) error {
	if cfg.DiskDir == "" || cfg.UpperDir != "" || cfg.WorkDir != "" {
		return errors.New("mount disk: needs DiskDir, and no upper or work dir")
	}
	if err := unix.Mount(cfg.Disk, cfg.DiskDir, "ext4", diskFlags, diskOpts); err != nil {
		return fmt.Errorf("mount disk %s on %s: %w", cfg.Disk, cfg.DiskDir, err)
	}
	cfg.UpperDir, cfg.WorkDir = cfg.DiskDir+"/upper", cfg.DiskDir+"/work"
	for _, d := range []struct {
		path string
		mode uint32
	}{{cfg.UpperDir, 0o755}, {cfg.WorkDir, 0o700}} {
		if err := unix.Mkdir(d.path, d.mode); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mount disk: mkdir %s: %w", d.path, err)
		}
	}
	return nil
}

func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("pivot_root: chdir: %w", err)
	}
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

// mountAPIFS mounts /proc, /dev and friends under root ("" for /).
func mountAPIFS(root string) error {
	const nse = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	for _, m := range []mnt{
		{"proc", root + "/proc", "proc", nse, ""},
		{"tmpfs", root + "/dev", "tmpfs", unix.MS_NOSUID | unix.MS_STRICTATIME, "mode=755,size=65536k"},
	} {
		if err := mountAt(m); err != nil {
			return err
		}
	}
	if err := makeDev(root); err != nil {
		return err
	}
	for _, m := range []mnt{
		{"devpts", root + "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"},
		{"shm", root + "/dev/shm", "tmpfs", nse, "mode=1777,size=65536k"},
		{"sysfs", root + "/sys", "sysfs", nse | unix.MS_RDONLY, ""},
	} {
		if err := mountAt(m); err != nil {
			return err
		}
	}
	return nil
}

func mountAt(m mnt) error {
	if err := os.MkdirAll(m.dst, 0o755); err != nil {
		return fmt.Errorf("mount %s: %w", m.dst, err)
	}
	if err := unix.Mount(m.src, m.dst, m.fstype, m.flags, m.data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", m.fstype, m.dst, err)
	}
	return nil
}

func makeDev(root string) error {
	for _, d := range devNodes {
		p := root + "/dev/" + d.name
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(d.major, d.minor))); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
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

// mountShell puts the node's static shell at initproto.ShellPath inside the
// root: a read-only bind of the host file on a file of a tiny tmpfs, itself
// remounted read-only. The directory is a mount point, so from inside it
// can be neither written, renamed, removed nor mounted over.
func mountShell(cfg *initproto.Config) error {
	if cfg.Shell == "" {
		return nil
	}
	dir := filepath.Join(cfg.Rootfs, filepath.Dir(initproto.ShellPath))
	file := filepath.Join(cfg.Rootfs, initproto.ShellPath)
	steps := []struct {
		what string
		do   func() error
	}{
		{"make dir", func() error { return ignoreExist(unix.Mkdir(dir, 0o755)) }},
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
		{"bind", func() error { return unix.Mount(cfg.Shell, file, "", unix.MS_BIND, "") }},
		{"bind read-only", func() error {
			return unix.Mount("", file, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
		}},
		{"tmpfs read-only", func() error {
			return unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "size=64k,mode=0755")
		}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			return fmt.Errorf("mount shell %s: %s: %w", cfg.Shell, st.what, err)
		}
	}
	return nil
}

// mountResolvConf binds the node's resolv.conf read-only over
// /etc/resolv.conf, so that every resolver library asks the node's DNS
// proxy. It is convenience, not enforcement: the eBPF programs refuse any
// other resolver whatever the file says. A symlink in the image (Debian's
// points into /run) is replaced by a file in the sandbox's upper layer
// first, never followed.
func mountResolvConf(cfg *initproto.Config) error {
	if cfg.ResolvConf == "" {
		return nil
	}
	etc := filepath.Join(cfg.Rootfs, "etc")
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
		{"bind", func() error { return unix.Mount(cfg.ResolvConf, file, "", unix.MS_BIND, "") }},
		{"bind read-only", func() error {
			return unix.Mount("", file, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
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
