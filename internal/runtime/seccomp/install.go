package seccomp

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Install loads the program with seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC)
// so every thread of the Go process gets it, and every process forked afterwards inherits
// it. The caller has already set no_new_privs (or has CAP_SYS_ADMIN). A filter cannot be
// removed: call Install once, as the last privileged step before serving.
func Install(prog []unix.SockFilter) error {
	return install(prog, unix.SECCOMP_FILTER_FLAG_TSYNC)
}

// InstallThread loads the program on the calling OS thread only (lock it with
// runtime.LockOSThread). A process that then calls execve from that thread
// runs the new program under the filter: that is how corral-init hardens
// itself once, single-threaded, instead of synchronising every Go thread.
func InstallThread(prog []unix.SockFilter) error {
	return install(prog, 0)
}

func install(prog []unix.SockFilter, flags uintptr) error {
	if len(prog) == 0 || len(prog) > maxInsns {
		return fmt.Errorf("seccomp: install: program has %d instructions (want 1..%d)", len(prog), maxInsns)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	tid, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		flags, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	switch {
	case errors.Is(errno, unix.EACCES):
		return fmt.Errorf("seccomp: install: %w (set no_new_privs first, or hold CAP_SYS_ADMIN)", errno)
	case errno != 0:
		return fmt.Errorf("seccomp: install: %w", errno)
	case tid != 0:
		// With TSYNC a positive return is the thread that could not take the filter (it has
		// a diverging filter of its own); nothing was installed.
		return fmt.Errorf("seccomp: install: thread %d could not be synchronized", tid)
	}
	return nil
}
