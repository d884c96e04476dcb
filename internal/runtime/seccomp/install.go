package seccomp

import (
	"encoding/binary"
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

// insnSize is the size of one struct sock_filter.
const insnSize = 8

// Encode serialises a program for sending to another process (the node
// compiles the profile once; every sandbox init installs the bytes).
func Encode(prog []unix.SockFilter) []byte {
	out := make([]byte, 0, len(prog)*insnSize)
	for _, in := range prog {
		out = binary.LittleEndian.AppendUint16(out, in.Code)
		out = append(out, in.Jt, in.Jf)
		out = binary.LittleEndian.AppendUint32(out, in.K)
	}
	return out
}

// Decode is the inverse of Encode.
func Decode(b []byte) ([]unix.SockFilter, error) {
	if len(b) == 0 || len(b)%insnSize != 0 || len(b)/insnSize > maxInsns {
		return nil, fmt.Errorf("seccomp: decode: %d bytes is not a program of 1..%d instructions", len(b), maxInsns)
	}
	prog := make([]unix.SockFilter, len(b)/insnSize)
	for i := range prog {
		in := b[i*insnSize:]
		prog[i] = unix.SockFilter{
			Code: binary.LittleEndian.Uint16(in),
			Jt:   in[2],
			Jf:   in[3],
			K:    binary.LittleEndian.Uint32(in[4:]),
		}
	}
	return prog, nil
}
