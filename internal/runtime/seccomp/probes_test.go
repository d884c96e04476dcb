//go:build linux && amd64

package seccomp

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

const (
	eperm   = int(unix.EPERM)
	enosys  = int(unix.ENOSYS)
	nowhere = "/nonexistent-corral-seccomp-test"
	high32  = 0xdeadbeef00000000
)

// probes are the calls the threat model says must be refused, plus the ordinary work that
// must keep running (workload_test.go). Each targets something harmless (a missing path,
// a bad fd, /dev/null, a pipe), so unfiltered it fails with its own errno or succeeds.
func probes() []probe {
	ps := []probe{
		{name: "keyctl", want: eperm, run: func(string) result {
			return sys(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, arg(unix.KEY_SPEC_SESSION_KEYRING), 0)
		}},
		{name: "add_key", want: eperm, run: func(string) result { return sys(unix.SYS_ADD_KEY) }},
		{name: "request_key", want: eperm, run: func(string) result { return sys(unix.SYS_REQUEST_KEY) }},
		{name: "userfaultfd", want: eperm, run: func(string) result { return sysFD(unix.SYS_USERFAULTFD, unix.O_CLOEXEC) }},
		{name: "bpf", want: eperm, run: func(string) result { return sys(unix.SYS_BPF, unix.BPF_PROG_LOAD, 0, 0) }},
		{name: "perf_event_open", want: eperm, run: func(string) result {
			return sysFD(unix.SYS_PERF_EVENT_OPEN, 0, 0, arg(-1), arg(-1), 0)
		}},
		{name: "unshare/NEWUSER", want: eperm, run: func(string) result { return sys(unix.SYS_UNSHARE, unix.CLONE_NEWUSER) }},
		{name: "unshare/NEWUSER|NEWNS", want: eperm, run: func(string) result {
			return sys(unix.SYS_UNSHARE, unix.CLONE_NEWUSER|unix.CLONE_NEWNS)
		}},
		{name: "setns", want: eperm, run: func(string) result { return sys(unix.SYS_SETNS, arg(-1), 0) }},
		{name: "mount", want: eperm, run: func(string) result {
			return sys(unix.SYS_MOUNT, cstr("none"), cstr(nowhere), cstr("tmpfs"), 0, 0)
		}},
		{name: "umount2", want: eperm, run: func(string) result { return sys(unix.SYS_UMOUNT2, cstr(nowhere), 0) }},
		{name: "pivot_root", want: eperm, run: func(string) result {
			return sys(unix.SYS_PIVOT_ROOT, cstr(nowhere), cstr(nowhere))
		}},
		{name: "chroot", want: eperm, run: func(string) result { return sys(unix.SYS_CHROOT, cstr(nowhere)) }},
		{name: "open_by_handle_at", want: eperm, run: func(string) result {
			return sysFD(unix.SYS_OPEN_BY_HANDLE_AT, arg(unix.AT_FDCWD), buf(128), unix.O_RDONLY)
		}},
		{name: "name_to_handle_at", want: eperm, run: func(string) result {
			return sys(unix.SYS_NAME_TO_HANDLE_AT, arg(unix.AT_FDCWD), cstr("/"), 0, 0, 0)
		}},
		{name: "ptrace/PEEKUSER-pid1", want: eperm, run: func(string) result { return sys(unix.SYS_PTRACE, unix.PTRACE_PEEKUSR, 1, 0, 0) }},
		{name: "process_vm_readv", want: eperm, run: func(string) result {
			return sys(unix.SYS_PROCESS_VM_READV, uintptr(os.Getpid()), 0, 0, 0, 0, 0)
		}},
		{name: "process_vm_writev", want: eperm, run: func(string) result {
			return sys(unix.SYS_PROCESS_VM_WRITEV, uintptr(os.Getpid()), 0, 0, 0, 0, 0)
		}},
		{name: "init_module", want: eperm, run: func(string) result { return sys(unix.SYS_INIT_MODULE, 0, 0, cstr("")) }},
		{name: "finit_module", want: eperm, run: func(string) result { return sys(unix.SYS_FINIT_MODULE, arg(-1), cstr(""), 0) }},
		{name: "delete_module", want: eperm, run: func(string) result {
			return sys(unix.SYS_DELETE_MODULE, cstr("corral_no_such_module"), unix.O_NONBLOCK)
		}},
		{name: "kexec_load", want: eperm, unsafe: true, run: func(string) result {
			return sys(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0x8000) // undefined flag: EINVAL if it got through
		}},
		{name: "kexec_file_load", want: eperm, unsafe: true, run: func(string) result {
			return sys(unix.SYS_KEXEC_FILE_LOAD, arg(-1), arg(-1), 0, 0, 0x8000)
		}},
		{name: "reboot", want: eperm, unsafe: true, run: func(string) result { return sys(unix.SYS_REBOOT, 0, 0, 0, 0) }},
		{name: "swapon", want: eperm, run: func(string) result { return sys(unix.SYS_SWAPON, cstr(nowhere), 0) }},
		{name: "syslog", want: eperm, run: func(string) result { return sys(unix.SYS_SYSLOG, unix.SYSLOG_ACTION_SIZE_BUFFER, 0, 0) }},
		{name: "acct", want: eperm, run: func(string) result { return sys(unix.SYS_ACCT, cstr(nowhere)) }},
		{name: "iopl", want: eperm, run: func(string) result { return sys(unix.SYS_IOPL, 0) }},
		{name: "ioperm", want: eperm, run: func(string) result { return sys(unix.SYS_IOPERM, 0x80, 1, 0) }},
		{name: "quotactl", want: eperm, run: func(string) result { return sys(unix.SYS_QUOTACTL, 0x800004, cstr(nowhere), 0, 0) }},
		{name: "lookup_dcookie", want: eperm, run: func(string) result { return sys(unix.SYS_LOOKUP_DCOOKIE, 0, 0, 0) }},
		{name: "fsopen", want: eperm, run: func(string) result { return sysFD(unix.SYS_FSOPEN, cstr("tmpfs"), unix.FSOPEN_CLOEXEC) }},
		{name: "fspick", want: eperm, run: func(string) result { return sysFD(unix.SYS_FSPICK, arg(unix.AT_FDCWD), cstr(nowhere), 0) }},
		{name: "open_tree", want: eperm, run: func(string) result {
			return sysFD(unix.SYS_OPEN_TREE, arg(unix.AT_FDCWD), cstr(nowhere), unix.OPEN_TREE_CLONE)
		}},
		{name: "move_mount", want: eperm, run: func(string) result {
			return sys(unix.SYS_MOVE_MOUNT, arg(-1), cstr(""), arg(-1), cstr(""), 0)
		}},
		{name: "file_getattr", want: eperm, run: func(string) result {
			return sys(unix.SYS_FILE_GETATTR, arg(unix.AT_FDCWD), cstr("/"), buf(64), 64, 0)
		}},
		{name: "io_uring_setup", want: enosys, run: func(string) result { return sysFD(unix.SYS_IO_URING_SETUP, 1, 0) }},
		{name: "io_uring_enter", want: enosys, run: func(string) result { return sys(unix.SYS_IO_URING_ENTER, arg(-1), 0, 0, 0, 0, 0) }},
		{name: "clone3", want: enosys, run: func(string) result { return sys(unix.SYS_CLONE3, 0, 0) }},
		{name: "personality/READ_IMPLIES_EXEC", want: eperm, run: func(string) result { return sys(unix.SYS_PERSONALITY, 0x0400000) }},
		{name: "personality/query", want: wantOK, run: func(string) result { return sys(unix.SYS_PERSONALITY, 0xffffffff) }},
		{name: "nr-above-table", want: enosys, run: func(string) result { return sys(999) }},
		{name: "nr-in-table-hole", want: enosys, run: func(string) result { return sys(400) }},
		{name: "x32-getpid", want: eperm, run: func(string) result { return sys(x32SyscallBit | unix.SYS_GETPID) }},
		{name: "mknod/block-device", want: eperm, run: func(dir string) result {
			return fromErr(unix.Mknod(filepath.Join(dir, "blk"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))))
		}},
		{name: "mknod/char-device", want: eperm, run: func(dir string) result {
			return fromErr(unix.Mknodat(unix.AT_FDCWD, filepath.Join(dir, "chr"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))))
		}},
		{name: "mknod/fifo", want: wantOK, run: func(dir string) result {
			return fromErr(unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
		}},
	}
	ps = append(ps, ioctlProbes()...)
	ps = append(ps, socketProbes()...)
	return append(ps, workloadProbes()...)
}

// arg passes a C int argument, negative ones sign-extended as the C ABI does.
func arg(n int) uintptr { return uintptr(n) }

// ioctlOn opens what (/dev/null, a pipe, or a temp file) and runs ioctl(fd, cmd, arg).
func ioctlOn(what string, cmd uint64) func(dir string) result {
	return func(dir string) result {
		var fd int
		switch what {
		case "pipe":
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				return fromErr(err)
			}
			defer unix.Close(p[1])
			fd = p[0]
		case "file":
			f, err := os.CreateTemp(dir, "ioctl")
			if err != nil {
				return fromErr(err)
			}
			defer f.Close()
			fd2, err := unix.Dup(int(f.Fd()))
			if err != nil {
				return fromErr(err)
			}
			fd = fd2
		default:
			f, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return fromErr(err)
			}
			fd = f
		}
		defer unix.Close(fd)
		return sys(unix.SYS_IOCTL, uintptr(fd), uintptr(cmd), buf(256))
	}
}

func ioctlProbes() []probe {
	return []probe{
		{name: "ioctl/FS_IOC_FSGETXATTR", want: eperm, run: ioctlOn("file", fsIocFsgetxattr)},
		{name: "ioctl/FS_IOC_FSGETXATTR-high-bits", want: eperm, run: ioctlOn("file", fsIocFsgetxattr|high32)},
		{name: "ioctl/FS_IOC_FSSETXATTR", want: eperm, unsafe: true, run: ioctlOn("file", fsIocFssetxattr)},
		{name: "ioctl/XFS_IOC_GOINGDOWN", want: eperm, unsafe: true, run: ioctlOn("pipe", 0x8004587d)},
		{name: "ioctl/XFS_IOC_GOINGDOWN-high-bits", want: eperm, unsafe: true, run: ioctlOn("pipe", 0x8004587d|high32)},
		{name: "ioctl/XFS_IOC_SWAPEXT", want: eperm, unsafe: true, run: ioctlOn("pipe", 0xc0c0586d)},
		{name: "ioctl/XFS_IOC_FSBULKSTAT", want: eperm, unsafe: true, run: ioctlOn("pipe", 0xc0205865)},
		{name: "ioctl/FIFREEZE", want: eperm, unsafe: true, run: ioctlOn("pipe", 0xc0045877)},
		{name: "ioctl/FITHAW", want: eperm, unsafe: true, run: ioctlOn("pipe", 0xc0045878)},
		{name: "ioctl/TIOCSTI", want: eperm, run: ioctlOn("null", tiocsti)},
		{name: "ioctl/TIOCSTI-high-bits", want: eperm, run: ioctlOn("null", tiocsti|high32)},
		{name: "ioctl/TIOCLINUX", want: eperm, run: ioctlOn("null", tioclinux)},
		{name: "ioctl/TCGETS-allowed", want: int(unix.ENOTTY), run: ioctlOn("null", unix.TCGETS)},
		{name: "ioctl/FIONREAD-allowed", want: wantOK, run: ioctlOn("pipe", 0x541b)},
		{name: "ioctl/FICLONE-allowed", want: wantNotEPERM, run: ioctlOn("file", unix.FICLONE)},
	}
}

func socketProbes() []probe {
	sock := func(family, typ, proto int) func(string) result {
		return func(string) result { return sysFD(unix.SYS_SOCKET, uintptr(family), uintptr(typ), uintptr(proto)) }
	}
	return []probe{
		{name: "socket/AF_ALG", want: eperm, run: sock(unix.AF_ALG, unix.SOCK_SEQPACKET, 0)},
		{name: "socket/AF_VSOCK", want: eperm, run: sock(unix.AF_VSOCK, unix.SOCK_STREAM, 0)},
		{name: "socket/AF_PACKET", want: eperm, run: sock(unix.AF_PACKET, unix.SOCK_RAW, 0)},
		{name: "socket/AF_KEY", want: eperm, run: sock(unix.AF_KEY, unix.SOCK_RAW, 2)},
		{name: "socket/AF_INET-RAW", want: eperm, run: sock(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)},
		{name: "socket/AF_INET-RAW-CLOEXEC", want: eperm, run: sock(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)},
		{name: "socket/AF_INET6-RAW", want: eperm, run: sock(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6)},
		{name: "socket/AF_INET-STREAM", want: wantOK, run: sock(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)},
		{name: "socket/AF_INET-DGRAM", want: wantOK, run: sock(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK, 0)},
		{name: "socket/AF_INET6-STREAM", want: wantNotEPERM, run: sock(unix.AF_INET6, unix.SOCK_STREAM, 0)},
		{name: "socket/AF_UNIX", want: wantOK, run: sock(unix.AF_UNIX, unix.SOCK_STREAM, 0)},
		{name: "socket/AF_NETLINK-ROUTE", want: wantOK, run: sock(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)},
		{name: "socketpair/AF_UNIX", want: wantOK, run: func(string) result {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
			if err == nil {
				unix.Close(fds[0])
				unix.Close(fds[1])
			}
			return fromErr(err)
		}},
		{name: "socketpair/AF_INET", want: eperm, run: func(string) result {
			_, err := unix.Socketpair(unix.AF_INET, unix.SOCK_STREAM, 0)
			return fromErr(err)
		}},
	}
}
