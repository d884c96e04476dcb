package initproc

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// What one call could leave for the next in a pooled sandbox, besides its
// processes and files, and how a reset removes it (cleanup instead of a
// fresh IPC namespace and PID view, which the warm python, kept across
// calls, could not join):
//
//   - SysV IPC objects: removed (removeIPC).
//   - POSIX message queues live in the IPC namespace's own mqueue
//     filesystem, which exists whether or not anything mounts it: init
//     mounts it in its private root (poolMqueue, never visible to a call)
//     and unlinks every queue.
//   - The PID counter: the next pid is the first free one above the
//     namespace's cursor, so a call could tell from its own pid how many
//     processes an earlier one forked. Once every process of the calls is
//     gone, the reset sets the cursor (ns_last_pid) back to 1, so that the
//     threads the Go runtime starts in init between calls (a new forker
//     after a dirty reset, say) take low ids; just before it forks a
//     command init sets it to callPidBase: the call's first pid is
//     callPidBase+1 whatever earlier calls forked. A call the warm python
//     forks gets the lowest free id, which depends on what the reset keeps
//     (init's threads and the python), not on earlier calls' processes.
//     What stays: a thread the runtime started while a call ran keeps its
//     id above the base, so a later call forking many processes may skip
//     one number.
//
// The IPC and PID sysctls (/proc/sys/kernel/*, fs/mqueue/*) are read-only in
// the view, and the calls hold no CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE,
// so no call can change them. What stays: the ids of SysV objects carry a
// sequence number the kernel never rewinds (a later call's first shmget
// id tells whether earlier calls made SysV objects), a residual that only
// a new IPC namespace removes.

// poolMqueue is where init mounts the IPC namespace's mqueue filesystem.
const poolMqueue = "/q"

// mountMqueue mounts the mqueue filesystem of init's IPC namespace (the
// sandbox's) at root+poolMqueue.
func mountMqueue(root string) error {
	if err := os.Mkdir(root+poolMqueue, 0o700); err != nil {
		return fmt.Errorf("pool root: %w", err)
	}
	err := unix.Mount("mqueue", root+poolMqueue, "mqueue", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	if errors.Is(err, unix.ENODEV) {
		return nil // a kernel without POSIX message queues: nothing to remove
	}
	if err != nil {
		return fmt.Errorf("pool root: mount mqueue: %w", err)
	}
	return nil
}

// removeMqueues unlinks every POSIX message queue of the sandbox. The
// mqueue root's size grows by a fixed amount per queue, so once a listing
// has found the root empty, a stat that finds the same size shows that no
// queue was made since: one system call for the usual reset instead of the
// listing's six. Resets run with every call's process gone, so the root
// cannot change between that stat and listing.
func (p *pool) removeMqueues() error {
	var st unix.Stat_t
	if err := unix.Stat(poolMqueue, &st); err != nil {
		return fmt.Errorf("reset: stat message queues: %w", err)
	}
	if p.mqEmptySize > 0 && st.Size == p.mqEmptySize {
		return nil
	}
	ents, err := os.ReadDir(poolMqueue)
	if err != nil {
		return fmt.Errorf("reset: list message queues: %w", err)
	}
	if len(ents) == 0 {
		p.mqEmptySize = st.Size
	}
	for _, e := range ents {
		if err := unix.Unlink(poolMqueue + "/" + e.Name()); err != nil && err != unix.ENOENT {
			return fmt.Errorf("reset: remove message queue %s: %w", e.Name(), err)
		}
	}
	return nil
}

// callPidBase is where the PID cursor of a pooled sandbox stands before
// each call: well above init's threads and the warm python (a dozen ids),
// and below the smallest pid_max Linux allows (301).
const callPidBase = 100

// openPidCursor opens the PID namespace's cursor (ns_last_pid) for
// rewindPids, once: a sysctl's open costs several times its write, and a
// pooled sandbox rewinds twice per call. A kernel without
// checkpoint/restore support has no ns_last_pid, and so no way to rewind
// (nil): the counter then carries over.
func openPidCursor() (*os.File, error) {
	f, err := os.OpenFile(poolProc+"/sys/kernel/ns_last_pid", os.O_WRONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pool: open the pid cursor: %w", err)
	}
	return f, nil
}

// rewindPids sets the PID namespace's cursor to last (see above): the
// next process or thread gets the first free id above it.
func (p *pool) rewindPids(last int) error {
	if p.cursor == nil {
		return nil
	}
	if _, err := p.cursor.WriteAt([]byte(strconv.Itoa(last)), 0); err != nil {
		return fmt.Errorf("reset: rewind pids: %w", err)
	}
	return nil
}

// keptZombie reports whether pid is a zombie whose parent is kept: a
// child the warm python did not wait for (one a call cloned with
// CLONE_PARENT, say). SIGKILL cannot remove it, and its parent reaps it
// before it forks the next call.
func keptZombie(pid int, keep []int) bool {
	b, err := os.ReadFile(poolView + "/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 || f[0] != "Z" {
		return false
	}
	ppid, err := strconv.Atoi(f[1])
	return err == nil && slices.Contains(keep, ppid)
}
