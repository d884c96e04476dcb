package node

import (
	"context"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/state"
)

// paced calls fn, first after interval, then interval after the start of
// the last call or, when a call took more than share of that, so much
// later that calls take share of the time (share 1: every interval, or
// back to back when a call takes longer); until ctx ends, then closes
// done.
func paced(ctx context.Context, interval time.Duration, share float64, done chan<- struct{}, fn func()) {
	defer close(done)
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		fn()
		t.Reset(pause(interval, time.Since(start), share))
	}
}

// pause is how long paced waits after a call that took took.
func pause(interval, took time.Duration, share float64) time.Duration {
	return max(interval, time.Duration(float64(took)/share)) - took
}

// reapOnce enforces TTLs: it stops sandboxes idle past their idle_timeout
// or older than their max_lifetime, and deletes stopped sandboxes once the
// retention period has passed.
func (n *Node) reapOnce(ctx context.Context, now time.Time) {
	for _, e := range n.entries() {
		if e.fence.Load() != nil {
			continue // its migration decides; a lapse resumes it
		}
		rec := e.snapshot()
		switch {
		case rec.Phase == state.PhaseStopped:
			if now.Sub(rec.StoppedAt) > n.cfg.StoppedRetention {
				if _, err := n.Delete(ctx, rec.ID); err != nil {
					n.log.Error("delete expired stopped sandbox", "sandbox", rec.ID, "err", err)
				}
			}
		case now.Sub(rec.CreatedAt) > rec.MaxLifetime && rec.PauseAtEnd:
			if rec.Phase == state.PhaseRunning {
				if err := n.Pause(ctx, rec.ID); err != nil {
					n.log.Error("pause sandbox at the end of its lifetime", "sandbox", rec.ID, "err", err)
				}
			}
		case now.Sub(rec.CreatedAt) > rec.MaxLifetime:
			n.stop(ctx, e, e.live(), events.LifetimeReached, fmt.Sprintf("max_lifetime %s reached", rec.MaxLifetime))
		case rec.IdleTimeout > 0 && e.inflight.Load() == 0 && e.idleFor(now) > rec.IdleTimeout:
			if n.idleAct(ctx, rec) {
				continue
			}
			n.stop(ctx, e, e.live(), events.IdleStopped, fmt.Sprintf("idle_timeout %s elapsed", rec.IdleTimeout))
		}
	}
}

// stop kills a sandbox's processes and keeps its record and writable layer
// (until Delete or retention) with the reason. The entry stays locked while
// the backend stops, so no request slips in and a stopped sandbox has no
// processes left by the time anyone sees it stopped. typ is the event
// that reports it.
func (n *Node) stop(ctx context.Context, e *entry, sb backend.Sandbox, typ, reason string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sb != sb || sb == nil || e.deleting {
		return
	}
	n.log.Info("stopping sandbox", "sandbox", sb.ID(), "project", projectOf(e.rec), "reason", reason)
	if err := sb.Stop(ctx); err != nil {
		n.log.Error("stop sandbox", "sandbox", sb.ID(), "err", err)
	}
	e.markStoppedLocked(reason)
	n.putLocked(e)
	rec := e.snapshotLocked()
	f := resourceFigures(rec)
	f["lifetime_seconds"] = rec.StoppedAt.Sub(rec.CreatedAt).Seconds()
	n.emit(rec, typ, reason, f)
}
