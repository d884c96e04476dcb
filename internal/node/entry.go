package node

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/metrics"
	"github.com/corral-dev/corral/internal/state"
)

// entry is the node's view of one sandbox: its record, its live backend
// handle (nil once stopped) and request bookkeeping for the TTL reaper.
type entry struct {
	backend backend.Backend

	mu       sync.Mutex
	netMu    sync.Mutex // serialises network updates
	rec      *state.Record
	sb       backend.Sandbox
	deleting bool
	// recyclable: sb was made recyclable; set when the entry is made (the
	// warm pools count it held until its delete, or if recycled until it
	// is pooled).
	recyclable bool
	// packing is closed when the running pack ends, which packCancel
	// cancels (Delete does); nil when no pack runs.
	packing    chan struct{}
	packCancel context.CancelFunc

	lastActive atomic.Int64 // unix nanos of the last request
	inflight   atomic.Int32 // requests running now

	obs observed // samples, recent execs and event counters (observe.go)

	// fence is set while a migration holds the sandbox (fence.go);
	// changed under mu.
	fence atomic.Pointer[fence]

	// deleted is closed once Delete has taken the sandbox away (set with
	// deleting): a recycled sandbox lives on under another entry, which
	// watches it instead.
	deleted     chan struct{}
	deletedOnce sync.Once
}

// markDeleted closes e.deleted (e.mu held or not).
func (e *entry) markDeleted() {
	e.deletedOnce.Do(func() {
		if e.deleted != nil {
			close(e.deleted)
		}
	})
}

func (e *entry) touch() { e.lastActive.Store(time.Now().UnixNano()) }

func (e *entry) idleFor(now time.Time) time.Duration {
	return now.Sub(time.Unix(0, e.lastActive.Load()))
}

// snapshot returns a copy of the record that is safe to use unlocked.
func (e *entry) snapshot() *state.Record {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.snapshotLocked()
}

func (e *entry) snapshotLocked() *state.Record {
	rec := *e.rec
	rec.Env = slices.Clone(rec.Env)
	rec.Labels = maps.Clone(rec.Labels)
	rec.NetworkAllow = slices.Clone(rec.NetworkAllow)
	return &rec
}

// markStopped records that the sandbox's processes are gone.
func (e *entry) markStopped(reason string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.markStoppedLocked(reason)
}

func (e *entry) markStoppedLocked(reason string) {
	e.rec.Phase = state.PhaseStopped
	e.rec.StopReason = reason
	e.rec.StoppedAt = time.Now()
	e.sb = nil
}

// live returns the running sandbox, or nil once stopped.
func (e *entry) live() backend.Sandbox {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sb
}

// acquire returns the live sandbox for a request, resuming it first if it is
// paused, and counts the request as in flight until release is called.
func (n *Node) acquire(ctx context.Context, id string) (*entry, backend.Sandbox, error) {
	e, err := n.lookup(id)
	if err != nil {
		return nil, nil, err
	}
	sb, err := n.acquireEntry(ctx, e, id, nil)
	if err != nil {
		return nil, nil, err
	}
	return e, sb, nil
}

// acquireEntry is acquire of e; a fence other than own refuses it (checked
// again under the lock: a fence set after the lookup still holds).
func (n *Node) acquireEntry(ctx context.Context, e *entry, id string, own *fence) (backend.Sandbox, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f := e.fence.Load(); f != nil && f != own {
		return nil, f.refusal(id)
	}
	if e.deleting {
		return nil, errdefs.NotFound("sandbox %s is being deleted", id)
	}
	switch e.rec.Phase {
	case state.PhaseStopped:
		return nil, errdefs.FailedPrecondition("sandbox %s is stopped (%s); create a new one", id, e.rec.StopReason)
	case state.PhasePaused:
		start := time.Now()
		if err := e.sb.Resume(ctx); err != nil {
			return nil, err
		}
		n.cfg.Metrics.ObserveOp(e.rec.Backend, metrics.OpResume, time.Since(start))
		e.rec.Phase = state.PhaseRunning
		e.rec.Reclaimed, e.rec.ReclaimedResident = false, 0
		n.putLocked(e)
		n.emit(e.snapshotLocked(), events.Resumed, "a request resumed it", nil)
	}
	e.inflight.Add(1)
	e.touch()
	return e.sb, nil
}

func (e *entry) release() {
	e.touch()
	e.inflight.Add(-1)
}

func (n *Node) putLocked(e *entry) {
	if err := n.db.Put(e.snapshotLocked()); err != nil {
		n.log.Error("persist sandbox record", "sandbox", e.rec.ID, "err", err)
	}
}

// lookup finds sandbox id for a call, which a migration's fence refuses
// (every entry point but Get, List and Delete comes through here).
func (n *Node) lookup(id string) (*entry, error) {
	e, err := n.lookupAny(id)
	if err != nil {
		return nil, err
	}
	if f := e.fence.Load(); f != nil {
		return nil, f.refusal(id)
	}
	return e, nil
}

// lookupAny finds sandbox id, fenced or not.
func (n *Node) lookupAny(id string) (*entry, error) {
	if err := n.checkID(id); err != nil {
		return nil, err
	}
	n.mu.Lock()
	e, ok := n.sandboxes[id]
	n.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFound("sandbox %s not found", id)
	}
	return e, nil
}
