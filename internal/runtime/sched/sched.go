// Package sched sets CPU scheduling attributes of the node's own process.
// It imports only the standard library and golang.org/x/sys/unix.
package sched

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// ShortSlice is the EEVDF slice of latency-sensitive threads: the node
// daemon's, and sandbox inits' (which set their own). With the kernel's
// default slice (0.7 ms × (1 + log2 CPUs)) every wakeup on the exec path —
// node, init, command, init, node — may wait a whole slice behind a
// sandbox spinning on every core; a shorter slice gives the waking thread
// an earlier deadline, and so the CPU at once (Linux 6.12's PREEMPT_SHORT).
// It costs only the threads that have it: the kernel's minimum is 100 µs.
const ShortSlice = 100 * time.Microsecond

// SetSlice gives every thread of this process an EEVDF slice of d
// (sched_attr.sched_runtime for SCHED_OTHER and SCHED_BATCH; other
// policies are left alone). Threads made later are cloned
// from these and keep it. Kernels before 6.12 have no custom slices
// (EINVAL): the caller may treat that as harmless.
func SetSlice(d time.Duration) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("set slice: %w", err)
	}
	var errs []error
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		attr, err := unix.SchedGetAttr(tid, 0)
		if err == nil && (attr.Policy == unix.SCHED_NORMAL || attr.Policy == unix.SCHED_BATCH) {
			// Policy and nice stay what the operator chose.
			attr.Size, attr.Flags, attr.Runtime = unix.SizeofSchedAttr, 0, uint64(d.Nanoseconds())
			err = unix.SchedSetAttr(tid, attr, 0)
		}
		if err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("thread %d: %w", tid, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("set slice %v: %w", d, err)
	}
	return nil
}
