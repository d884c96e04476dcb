package main

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/probeproto"
)

// schedAttempts try to leave SCHED_IDLE, in a best-effort sandbox (mode
// "sched"): back to SCHED_OTHER or SCHED_BATCH, or by raising RLIMIT_NICE
// first. Each must fail with EPERM. If the probe does not even start under
// SCHED_IDLE, every attempt reports success: the class did not hold.
func schedAttempts() []probeproto.Result {
	attr, err := unix.SchedGetAttr(0, 0)
	if err != nil || attr.Policy != unix.SCHED_IDLE {
		detail := fmt.Sprintf("not under SCHED_IDLE: policy %v (%v)", policy(attr), err)
		var out []probeproto.Result
		for _, n := range []string{"sched/leave-idle", "sched/leave-idle-batch", "sched/raise-rlimit-nice"} {
			out = append(out, probeproto.Result{Name: n, Outcome: succeeded, Detail: detail})
		}
		return out
	}
	set := func(p uint32) error {
		return unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: p}, 0)
	}
	return []probeproto.Result{
		fromErr("sched/leave-idle", set(unix.SCHED_NORMAL), "sched_setattr SCHED_OTHER"),
		fromErr("sched/leave-idle-batch", set(unix.SCHED_BATCH), "sched_setattr SCHED_BATCH"),
		fromErr("sched/raise-rlimit-nice", unix.Setrlimit(unix.RLIMIT_NICE, &unix.Rlimit{Cur: 40, Max: 40}), "setrlimit RLIMIT_NICE 40"),
	}
}

func policy(a *unix.SchedAttr) any {
	if a == nil {
		return "?"
	}
	return a.Policy
}
