package fncall

import (
	"context"
	"log/slog"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

// cpuPoll is how often a call's CPU use is read while it runs.
const cpuPoll = 10 * time.Millisecond

// cpuWatch measures and bounds a call's CPU by its sandbox's cgroup
// accounting, which counts every process the call starts: wait4 of the
// direct child (and RLIMIT_CPU, which is per process) misses detached,
// double-forked ones. Calls on a pooled sandbox are serial, so the
// cgroup's usage since the call began is the call's (plus the warm
// python's few microseconds of bookkeeping).
type cpuWatch struct {
	rs    backend.Resetter
	log   *slog.Logger
	keep  []int
	limit time.Duration
	start time.Duration
	stop  chan struct{}
	done  chan struct{}
}

// watchCPU starts watching; keep are the pids (inside the sandbox) that
// outlive the call: its warm python. With no accounting it returns nil,
// and the call keeps its per-process limits only.
func watchCPU(rs backend.Resetter, log *slog.Logger, limit time.Duration, keep []int) *cpuWatch {
	u0, err := rs.CPUUsage()
	if err != nil {
		log.Warn("fncall: no cgroup CPU accounting; the call's CPU limit is per process", "err", err)
		return nil
	}
	w := &cpuWatch{rs: rs, log: log, keep: keep, limit: limit, start: u0, stop: make(chan struct{}), done: make(chan struct{})}
	go w.loop()
	return w
}

func (w *cpuWatch) loop() {
	defer close(w.done)
	t := time.NewTicker(cpuPoll)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		if u, err := w.rs.CPUUsage(); err == nil && u-w.start >= w.limit {
			w.killRest()
			return
		}
	}
}

// killRest kills every process of the call (what keep does not name).
func (w *cpuWatch) killRest() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.rs.KillAllBut(ctx, w.keep); err != nil {
		w.log.Warn("fncall: kill the call's processes", "err", err)
	}
}

// end kills what the call left running (detached processes end with the
// call) unless the caller knows none is left (kill false), and returns the
// CPU time all its processes used. A nil watch returns 0.
func (w *cpuWatch) end(kill bool) time.Duration {
	if w == nil {
		return 0
	}
	close(w.stop)
	<-w.done
	if kill {
		w.killRest()
	}
	u, err := w.rs.CPUUsage()
	if err != nil {
		return 0
	}
	return u - w.start
}
