package main

import (
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/probeproto"
)

// surfaceAttempts are the /proc, /sys, terminal and device-node rows.
func surfaceAttempts() {
	attempt("procfs-read", func() []probeproto.Result {
		var rs []probeproto.Result
		// Only the first bytes: page 0's entry, never the offsets that
		// crashed kernels.
		for _, p := range []string{"/proc/kpagecgroup", "/proc/kpageflags", "/proc/kpagecount", "/proc/kcore",
			"/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/kmsg"} {
			b, err := readSome(p, 8)
			rs = append(rs, readResult("procfs-read:"+p, b, err))
		}
		return rs
	})
	attempt("procfs-write", func() []probeproto.Result {
		var rs []probeproto.Result
		// Opened for writing and closed: nothing is ever written.
		for _, c := range []struct{ name, path string }{
			{"procfs-write:/proc/sysrq-trigger", "/proc/sysrq-trigger"},
			{"procfs-write:/proc/sys/kernel/core_pattern", "/proc/sys/kernel/core_pattern"},
			{"procfs-write:/proc/sys/vm/drop_caches", "/proc/sys/vm/drop_caches"},
			{"sysfs-write:/sys/kernel/uevent_helper", "/sys/kernel/uevent_helper"},
			{"sysfs-write:/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/mm/transparent_hugepage/enabled"},
			{"sysfs-write:/sys/fs/cgroup", "/sys/fs/cgroup/corral-probe"},
		} {
			var err error
			if c.name == "sysfs-write:/sys/fs/cgroup" {
				err = unix.Mkdir(c.path, 0o755)
				if err == nil {
					_ = unix.Rmdir(c.path)
				}
			} else {
				var f *os.File
				f, err = os.OpenFile(c.path, os.O_WRONLY, 0)
				if err == nil {
					f.Close()
				}
			}
			rs = append(rs, fromErr(c.name, err, "open for writing only"))
		}
		return rs
	})
	attempt("tty", ttyAttempts)
	attempt("mknod", func() []probeproto.Result {
		var rs []probeproto.Result
		for _, c := range []struct {
			name         string
			mode         uint32
			major, minor uint32
		}{
			{"mknod/block", unix.S_IFBLK | 0o600, 8, 0}, // sda
			{"mknod/char-mem", unix.S_IFCHR | 0o600, 1, 1},
		} {
			p := "/corral-probe-dev"
			err := unix.Mknod(p, c.mode, int(unix.Mkdev(c.major, c.minor)))
			if err == nil {
				os.Remove(p)
			}
			rs = append(rs, fromErr(c.name, err, p))
		}
		return rs
	})
}

func ttyAttempts() []probeproto.Result {
	c := byte('#')
	_, _, e := unix.Syscall(unix.SYS_IOCTL, 0, unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	rs := []probeproto.Result{fromErr("tty/tiocsti-stdin", errnoOf(e), "TIOCSTI on fd 0")}
	master, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return append(rs, fromErr("tty/tiocsti-pty", err, "open /dev/ptmx"))
	}
	defer unix.Close(master)
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		return append(rs, fromErr("tty/tiocsti-pty", err, "unlockpt"))
	}
	n, err := unix.IoctlGetInt(master, unix.TIOCGPTN)
	if err != nil {
		return append(rs, fromErr("tty/tiocsti-pty", err, "ptsname"))
	}
	slave, err := unix.Open("/dev/pts/"+strconv.Itoa(n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return append(rs, fromErr("tty/tiocsti-pty", err, "open pty"))
	}
	defer unix.Close(slave)
	_, _, e = unix.Syscall(unix.SYS_IOCTL, uintptr(slave), unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	return append(rs, fromErr("tty/tiocsti-pty", errnoOf(e), "TIOCSTI on a pty of our own"))
}
