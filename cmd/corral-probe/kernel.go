package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/probeproto"
)

// x86_64 ioctl commands the XFS rows name (from xfs_fs.h and fs.h).
const (
	xfsIocSwapext    = 0xc0c0586d // _IOWR('X', 109, struct xfs_swapext)
	xfsIocGoingdown  = 0x8004587d // _IOR('X', 125, uint32)
	xfsIocFsbulkstat = 0xc0205865 // _IOWR('X', 101, struct xfs_fsop_bulkreq)
	fsIocFsgetxattr  = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIocFssetxattr  = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	hi32             = 0xdead0000_00000000
	// goingdownBadFlags is no XFS_FSOP_GOING_FLAGS_* value: an ioctl that
	// got past every check would fail with EINVAL instead of shutting a
	// filesystem down.
	goingdownBadFlags = 0xdead
)

func errnoOf(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// kernelAttempts are the "filesystem and kernel surface" rows.
func kernelAttempts(in probeproto.Input) {
	attempt("ioctl", ioctlAttempts)
	attempt("open_by_handle_at", func() []probeproto.Result {
		root, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return one(fromErr("open_by_handle_at", err, "open /"))
		}
		defer unix.Close(root)
		// The shocker guess: an ext4/xfs FILEID_INO32_GEN handle of inode 2.
		h := unix.NewFileHandle(1, []byte{2, 0, 0, 0, 0, 0, 0, 0})
		fd, err := unix.OpenByHandleAt(root, h, unix.O_RDONLY)
		if err == nil {
			unix.Close(fd)
		}
		_, _, nerr := unix.NameToHandleAt(unix.AT_FDCWD, "/", 0)
		return []probeproto.Result{fromErr("open_by_handle_at", err, "inode 2 of /"), fromErr("name_to_handle_at", nerr, "/")}
	})
	attempt("mount", mountAttempts)
	attempt("syscalls", syscallAttempts)
	attempt("sockets", socketAttempts)
	attempt("ptrace", func() []probeproto.Result { return ptraceAttempts(in.Pids) })
}

func ioctlAttempts() []probeproto.Result {
	const p = "/corral-probe-ioctl"
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return one(fromErr("ioctl/open", err, p))
	}
	defer os.Remove(p)
	defer f.Close()
	if _, err := f.Write(make([]byte, 65536)); err != nil {
		return one(fromErr("ioctl/write", err, p))
	}
	g, err := os.OpenFile(p+"-tmp", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return one(fromErr("ioctl/open", err, p+"-tmp"))
	}
	defer os.Remove(p + "-tmp")
	defer g.Close()
	var st unix.Statfs_t
	_ = unix.Fstatfs(int(f.Fd()), &st)
	fsType := fmt.Sprintf("fs magic %#x", st.Type)

	swap := ioctlBufs.swap[:]
	put64 := func(b []byte, off int, v int64) { *(*int64)(unsafe.Pointer(&b[off])) = v }
	put64(swap, 8, int64(f.Fd()))
	put64(swap, 16, int64(g.Fd()))
	put64(swap, 32, 65536)
	goingdown := uint32(goingdownBadFlags)
	b := &ioctlBufs
	bulk := b.bulk[:]
	put64(bulk, 0, int64(uintptr(unsafe.Pointer(&b.lastip))))
	put64(bulk, 8, 1)
	put64(bulk, 16, int64(uintptr(unsafe.Pointer(&b.statbuf[0]))))
	put64(bulk, 24, int64(uintptr(unsafe.Pointer(&b.ocount))))
	fsx := make([]byte, 28) // struct fsxattr, all zero: no flags, project 0

	var rs []probeproto.Result
	for _, c := range []struct {
		name string
		cmd  uintptr
		arg  unsafe.Pointer
	}{
		{"ioctl/xfs-swapext", xfsIocSwapext, unsafe.Pointer(&swap[0])},
		{"ioctl/xfs-goingdown", xfsIocGoingdown, unsafe.Pointer(&goingdown)},
		{"ioctl/xfs-fsbulkstat", xfsIocFsbulkstat, unsafe.Pointer(&bulk[0])},
		{"ioctl/fs-fsgetxattr", fsIocFsgetxattr, unsafe.Pointer(&fsx[0])},
		{"ioctl/fs-fssetxattr", fsIocFssetxattr, unsafe.Pointer(&fsx[0])},
	} {
		for _, high := range []uintptr{0, hi32} {
			name := c.name
			if high != 0 {
				name += "+hi32"
			}
			_, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), c.cmd|high, uintptr(c.arg))
			rs = append(rs, fromErr(name, errnoOf(e), fmt.Sprintf("cmd %#x on %s (%s)", c.cmd|high, p, fsType)))
		}
	}
	return rs
}

// ioctlBufs live in a global, which never moves: the XFS structs carry
// pointers as integers, which neither the GC nor stack copying updates.
var ioctlBufs struct {
	swap    [0xc0]byte // struct xfs_swapext: version, fdtarget, fdtmp, offset, length, pad, bstat
	bulk    [32]byte   // struct xfs_fsop_bulkreq: *lastip, icount, *ubuffer, *ocount
	statbuf [64 * 256]byte
	lastip  uint64
	ocount  int32
}

// inDiscardedThread runs f on an OS thread that is thrown away afterwards,
// for calls that change per-thread state (namespaces, ptrace).
func inDiscardedThread(f func() error) error {
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		done <- f()
	}()
	return <-done
}

func mountAttempts() []probeproto.Result {
	dir, _ := os.MkdirTemp("", "corral-probe-mnt-")
	defer os.RemoveAll(dir)
	_ = os.Mkdir(dir+"/old", 0o755)
	var rs []probeproto.Result
	err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m")
	if err == nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}
	rs = append(rs, fromErr("mount/tmpfs", err, dir))
	rs = append(rs, fromErr("mount/umount-masked", unix.Unmount("/proc/kcore", unix.MNT_DETACH), "umount2 /proc/kcore"))
	rs = append(rs, fromErr("mount/unshare-newuser-newns", inDiscardedThread(func() error {
		return unix.Unshare(unix.CLONE_NEWUSER | unix.CLONE_NEWNS)
	}), "unshare(CLONE_NEWUSER|CLONE_NEWNS); EINVAL would mean the policy let it through (multi-threaded caller)"))
	rs = append(rs, fromErr("mount/unshare-newns", inDiscardedThread(func() error {
		return unix.Unshare(unix.CLONE_NEWNS)
	}), "unshare(CLONE_NEWNS)"))
	cmd := exec.Command("/proc/self/exe", "noop")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS}
	rs = append(rs, fromErr("mount/clone-newuser", cmd.Run(), "fork with CLONE_NEWUSER|CLONE_NEWNS"))
	rs = append(rs, fromErr("mount/setns", inDiscardedThread(func() error {
		fd, err := unix.Open("/proc/self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Setns(fd, unix.CLONE_NEWNS)
	}), "setns to own mount namespace"))
	// dir is no mount point: a pivot_root that got past the policy fails
	// with EINVAL.
	rs = append(rs, fromErr("mount/pivot_root", unix.PivotRoot(dir, dir+"/old"), dir))
	rs = append(rs, fromErr("mount/chroot", unix.Chroot("/"), "chroot / (a no-op if allowed)"))
	return rs
}

func syscallAttempts() []probeproto.Result {
	var rs []probeproto.Result
	sys := func(name string, nr uintptr, detail string, args ...uintptr) {
		var a [6]uintptr
		copy(a[:], args)
		r, _, e := unix.Syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
		if e == 0 && name != "keyctl" && name != "add_key" && int(r) >= 0 {
			unix.Close(int(r))
		}
		rs = append(rs, fromErr(name, errnoOf(e), detail))
	}
	ptr := func(s string) uintptr { b, _ := unix.BytePtrFromString(s); return uintptr(unsafe.Pointer(b)) }
	sys("keyctl", unix.SYS_KEYCTL, "KEYCTL_GET_KEYRING_ID session, create", unix.KEYCTL_GET_KEYRING_ID, uintptr(0xfffffffd), 1)
	sys("add_key", unix.SYS_ADD_KEY, "user key in the process keyring", ptr("user"), ptr("corral-probe"), ptr("x"), 1, uintptr(0xfffffffe))
	sys("request_key", unix.SYS_REQUEST_KEY, "user key", ptr("user"), ptr("corral-probe"), 0, 0)
	sys("userfaultfd", unix.SYS_USERFAULTFD, "O_CLOEXEC|O_NONBLOCK", unix.O_CLOEXEC|unix.O_NONBLOCK)
	params := make([]byte, 120) // struct io_uring_params
	sys("io_uring_setup", unix.SYS_IO_URING_SETUP, "1 entry", 1, uintptr(unsafe.Pointer(&params[0])))
	attr := make([]byte, 128) // union bpf_attr for BPF_MAP_CREATE: array, 4-byte keys and values, 1 entry
	*(*uint32)(unsafe.Pointer(&attr[0])) = unix.BPF_MAP_TYPE_ARRAY
	*(*uint32)(unsafe.Pointer(&attr[4])) = 4
	*(*uint32)(unsafe.Pointer(&attr[8])) = 4
	*(*uint32)(unsafe.Pointer(&attr[12])) = 1
	sys("bpf", unix.SYS_BPF, "BPF_MAP_CREATE array", unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr)))
	pe := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK, Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{}))}
	sys("perf_event_open", unix.SYS_PERF_EVENT_OPEN, "software cpu-clock on self", uintptr(unsafe.Pointer(&pe)), 0, ^uintptr(0), ^uintptr(0), 0)
	// KEXEC_ARCH_ARM: past the permission checks the call fails with
	// EINVAL (wrong architecture) and never loads or unloads an image.
	sys("kexec_load", unix.SYS_KEXEC_LOAD, "no segments, foreign arch flag (EINVAL past the policy)", 0, 0, 0, 40<<16)
	junk := []byte("corral-probe: not an ELF module\x00")
	sys("init_module", unix.SYS_INIT_MODULE, "non-ELF image (ENOEXEC past the policy)", uintptr(unsafe.Pointer(&junk[0])), uintptr(len(junk)), ptr(""))
	if f, err := os.CreateTemp("", "corral-probe-module-"); err == nil {
		_, _ = f.Write(junk)
		sys("finit_module", unix.SYS_FINIT_MODULE, "non-ELF file", f.Fd(), ptr(""), 0)
		f.Close()
		os.Remove(f.Name())
	}
	runtime.KeepAlive(params)
	runtime.KeepAlive(attr)
	runtime.KeepAlive(junk)
	return rs
}

func socketAttempts() []probeproto.Result {
	var rs []probeproto.Result
	for _, s := range []struct {
		name                  string
		family, typ, protocol int
	}{
		{"socket/af_alg", unix.AF_ALG, unix.SOCK_SEQPACKET, 0},
		{"socket/af_vsock", unix.AF_VSOCK, unix.SOCK_STREAM, 0},
		{"socket/af_packet", unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL))},
		{"socket/af_inet-raw", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP},
		{"socket/af_inet6-raw", unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6},
		// The kernel turns AF_INET+SOCK_PACKET into AF_PACKET.
		{"socket/af_inet-sock_packet", unix.AF_INET, unix.SOCK_PACKET, int(htons(unix.ETH_P_ALL))},
		{"socket/af_key", unix.AF_KEY, unix.SOCK_RAW, 2},
	} {
		fd, err := unix.Socket(s.family, s.typ|unix.SOCK_CLOEXEC, s.protocol)
		if err == nil {
			unix.Close(fd)
		}
		rs = append(rs, fromErr(s.name, err, fmt.Sprintf("socket(%d, %d, %d)", s.family, s.typ, s.protocol)))
	}
	return rs
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func ptraceAttempts(outside []int) []probeproto.Result {
	var rs []probeproto.Result
	attach := func(name string, pid int) {
		err := inDiscardedThread(func() error {
			err := unix.PtraceSeize(pid)
			if err == nil {
				_ = unix.PtraceDetach(pid)
			}
			return err
		})
		rs = append(rs, fromErr(name, err, fmt.Sprintf("PTRACE_SEIZE %d", pid)))
	}
	attach("ptrace/pid1", 1)
	buf := make([]byte, 8)
	local := []unix.Iovec{{Base: &buf[0], Len: 8}}
	self := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&buf[0])), Len: 8}}
	_, err := unix.ProcessVMReadv(1, local, self, 0)
	rs = append(rs, fromErr("process_vm_readv/pid1", err, "8 bytes"))
	_, err = unix.ProcessVMReadv(os.Getpid(), local, self, 0)
	rs = append(rs, fromErr("process_vm_readv/self", err, "8 bytes of own memory: only the policy refuses this"))
	if pidfd, err := unix.PidfdOpen(1, 0); err == nil {
		fd, err := unix.PidfdGetfd(pidfd, 0, 0)
		if err == nil {
			unix.Close(fd)
		}
		rs = append(rs, fromErr("pidfd_getfd/pid1", err, "fd 0 of init"))
		unix.Close(pidfd)
	} else {
		rs = append(rs, fromErr("pidfd_getfd/pid1", err, "pidfd_open(1)"))
	}
	for _, pid := range outside {
		attach("ptrace/outside", pid)
		_, err := unix.ProcessVMReadv(pid, local, self, 0)
		rs = append(rs, fromErr("process_vm_readv/outside", err, fmt.Sprintf("host pid %d", pid)))
	}
	return rs
}
