package initproc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"github.com/corral-dev/corral/internal/runtime/initproto"
	"golang.org/x/sys/unix"
)

// DefaultCaps is the capability set of a sandbox (bounding, permitted,
// effective and inheritable). Everything else — SYS_ADMIN, NET_RAW, MKNOD,
// SYS_CHROOT, SYS_PTRACE, SYS_RESOURCE … — is dropped from the bounding set,
// so no process inside can ever regain it.
var DefaultCaps = []uintptr{
	unix.CAP_CHOWN,
	unix.CAP_DAC_OVERRIDE,
	unix.CAP_FOWNER,
	unix.CAP_FSETID,
	unix.CAP_KILL,
	unix.CAP_SETGID,
	unix.CAP_SETUID,
	unix.CAP_SETFCAP,
	unix.CAP_NET_BIND_SERVICE,
}

// Package-level so that the kernel reads memory that stays put while
// AllThreadsSyscall runs on every thread.
var (
	capHdr  unix.CapUserHeader
	capData [2]unix.CapUserData
)

// harden applies the containment baseline to every thread of init:
// capabilities, no_new_privs, RLIMIT_CORE, non-dumpable, seccomp. Children
// inherit all of it. capset, PR_CAPBSET_DROP and no_new_privs are per-thread
// in Linux, hence AllThreadsSyscall (Go runs several threads).
func harden(cfg *initproto.Config) error {
	// Keep init itself out of the OOM killer's reach; exec children get 0
	// back (see server.start). Needs CAP_SYS_RESOURCE, so before the drop;
	// best effort, as hosts that withhold it from the node exist (init is
	// then merely the smallest OOM candidate).
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0); err != nil {
		fmt.Fprintln(os.Stderr, "corral-init: oom_score_adj:", err)
	}
	if err := dropBounding(); err != nil {
		return err
	}
	if err := setCaps(); err != nil {
		return err
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); e != 0 {
		return fmt.Errorf("clear ambient caps: %w", e)
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); e != 0 {
		return fmt.Errorf("no_new_privs: %w", e)
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("rlimit core: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("non-dumpable: %w", err)
	}
	if cfg.NoSeccomp {
		return nil
	}
	return installSeccomp()
}

func lastCap() (uintptr, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("cap_last_cap: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("cap_last_cap: %w", err)
	}
	return uintptr(n), nil
}

func keep(c uintptr) bool {
	for _, k := range DefaultCaps {
		if k == c {
			return true
		}
	}
	return false
}

func dropBounding() error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := uintptr(0); c <= last; c++ {
		if keep(c) {
			continue
		}
		if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0); e != 0 {
			return fmt.Errorf("drop bounding cap %d: %w", c, e)
		}
	}
	return nil
}

func setCaps() error {
	var mask [2]uint32
	for _, c := range DefaultCaps {
		mask[c/32] |= 1 << (c % 32)
	}
	capHdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	for i := range capData {
		capData[i] = unix.CapUserData{Effective: mask[i], Permitted: mask[i], Inheritable: mask[i]}
	}
	_, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET,
		uintptr(unsafe.Pointer(&capHdr)), uintptr(unsafe.Pointer(&capData[0])), 0)
	if e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}
