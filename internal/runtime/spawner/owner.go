package spawner

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// becomeOwner makes the calling (locked) thread's effective uid the
// sandbox's own host uid, keeping its capabilities, so that the user
// namespace it clones is owned by that uid rather than by host root.
//
// Why: the kernel charges per-user counts (inotify instances and watches,
// POSIX message queue bytes, user namespaces…) at every level of the user
// namespace hierarchy, and at the parent level it charges the namespace's
// owner, the creator's euid (kernel/ucount.c, inc_ucount and
// inc_rlimit_ucounts walk iter->ns->ucounts, whose uid is ns->owner). With
// root as every sandbox's owner, 128 inotify_init1 calls in one sandbox used
// up host root's fs.inotify.max_user_instances, for root and every other
// sandbox. Owned by its own uid, a sandbox gets the node's per-user limits
// for itself (fs.inotify.*, and the creator's RLIMIT_MSGQUEUE as its
// namespace's message queue cap), and nobody else is charged.
//
// SECBIT_NO_SETUID_FIXUP keeps the effective capabilities across the euid
// change, which the clone needs (CLONE_INTO_CGROUP's write permission) and
// which lets the node, still privileged, write the child's uid_map and
// gid_map (a range of more than one id needs CAP_SETUID/CAP_SETGID over
// the parent namespace). The real and saved uids stay 0, so restore can
// always switch back; raw syscalls change this thread only (Go's
// syscall.Setresuid would change every thread of the daemon).
func becomeOwner(uid uint32) (restore func() error, err error) {
	bits, err := unix.PrctlRetInt(unix.PR_GET_SECUREBITS, 0, 0, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("start init: get securebits: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits|secbitNoSetuidFixup), 0, 0, 0); err != nil {
		return nil, fmt.Errorf("start init: set securebits: %w", err)
	}
	undoBits := func() error {
		if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0); err != nil {
			return fmt.Errorf("start init: restore securebits: %w", err)
		}
		return nil
	}
	keep := ^uintptr(0) // -1: unchanged
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
		_ = undoBits()
		return nil, fmt.Errorf("start init: set euid %d: %w", uid, e)
	}
	return func() error {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, 0, keep); e != 0 {
			return fmt.Errorf("start init: restore euid 0: %w", e)
		}
		return undoBits()
	}, nil
}

// secbitNoSetuidFixup is SECBIT_NO_SETUID_FIXUP (linux/securebits.h).
const secbitNoSetuidFixup = 1 << 2
