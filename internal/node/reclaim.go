package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/state"
)

// Idle actions: what idle_timeout does to a sandbox.
const (
	IdleStop    = "stop"
	IdlePause   = "pause"
	IdleReclaim = "reclaim"
)

// bulkParallel bounds the pauses and resumes PauseMany and ResumeMany run
// at once (each is a few cgroup writes, or a VM snapshot).
const bulkParallel = 16

// inParallel calls fn(0) to fn(count-1), bulkParallel at once, and
// returns when all have.
func inParallel(count int, fn func(i int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, bulkParallel)
	for i := range count {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			fn(i)
		}()
	}
	wg.Wait()
}

func checkIdleAction(a string) error {
	switch a {
	case "", IdleStop, IdlePause, IdleReclaim:
		return nil
	}
	return errdefs.InvalidArgument("idle_action: %q is not one of stop, pause, reclaim", truncate(a))
}

// checkReclaimable fails a create asking for idle action reclaim that this
// node could not honour, before anything is made.
func (n *Node) checkReclaimable(rec *state.Record) error {
	if rec.IdleAction != IdleReclaim {
		return nil
	}
	if rec.Backend != "container" {
		return errdefs.NotSupported("not supported: idle_action reclaim on backend %s (containers only; use pause)", rec.Backend)
	}
	if !n.cfg.Swap {
		return errdefs.FailedPrecondition("idle_action: reclaim needs a swap area on the node (start corral serve with --swap SIZE)")
	}
	return nil
}

// committedMemory is what a sandbox takes of the node's memory: its limit,
// or what stayed in RAM after a reclaim.
func committedMemory(rec *state.Record) int64 {
	if rec.Reclaimed {
		return rec.ReclaimedResident
	}
	return rec.MemoryBytes
}

// Reclaimed is what a pause with reclaim did.
type Reclaimed struct {
	Before, After backend.Memory
}

// PauseReclaim pauses a sandbox and pushes its memory out of RAM (a
// container's to the node's swap area). On failure a sandbox this call
// paused is resumed again, so nothing is left half-done.
func (n *Node) PauseReclaim(ctx context.Context, id string) (Reclaimed, error) {
	e, err := n.lookup(id)
	if err != nil {
		return Reclaimed{}, err
	}
	wasPaused := e.snapshot().Phase == state.PhasePaused
	if err := n.Pause(ctx, id); err != nil {
		return Reclaimed{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if f := e.fence.Load(); f != nil {
		return Reclaimed{}, f.refusal(id)
	}
	r, err := n.reclaimLocked(ctx, e)
	if err != nil && !wasPaused && e.sb != nil && e.rec.Phase == state.PhasePaused {
		if rerr := e.sb.Resume(ctx); rerr == nil {
			e.rec.Phase = state.PhaseRunning
			n.putLocked(e)
			n.emit(e.snapshotLocked(), events.Resumed, "reclaim failed", nil)
		}
	}
	return r, err
}

func (n *Node) reclaimLocked(ctx context.Context, e *entry) (Reclaimed, error) {
	id := e.rec.ID
	switch {
	case e.deleting:
		return Reclaimed{}, errdefs.NotFound("sandbox %s is being deleted", id)
	case e.rec.Phase != state.PhasePaused || e.sb == nil:
		return Reclaimed{}, errdefs.FailedPrecondition("sandbox %s was resumed before its memory could be reclaimed", id)
	}
	rc, ok := e.sb.(backend.Reclaimer)
	if !ok {
		return Reclaimed{}, errdefs.NotSupported("not supported: pause --reclaim on backend %s", e.backend.Name())
	}
	start := time.Now()
	before, after, err := rc.Reclaim(ctx, n.cfg.Swap)
	if err != nil {
		return Reclaimed{}, fmt.Errorf("reclaim sandbox %s: %w", id, err)
	}
	e.rec.Reclaimed, e.rec.ReclaimedResident = true, after.ResidentBytes
	n.putLocked(e)
	n.emit(e.snapshotLocked(), events.Paused, "memory reclaimed", map[string]float64{
		"resident_before_bytes": float64(before.ResidentBytes),
		"resident_after_bytes":  float64(after.ResidentBytes),
		"swapped_bytes":         float64(after.SwappedBytes),
		"reclaim_seconds":       time.Since(start).Seconds(),
	})
	return Reclaimed{Before: before, After: after}, nil
}

// Memory reads where a sandbox's memory is now; ok is false for a backend
// that does not tell, or a sandbox that is not running.
func (n *Node) Memory(ctx context.Context, id string) (backend.Memory, bool, error) {
	e, err := n.lookup(id)
	if err != nil {
		return backend.Memory{}, false, err
	}
	rc, ok := e.live().(backend.Reclaimer)
	if !ok {
		return backend.Memory{}, false, nil
	}
	m, err := rc.Memory(ctx)
	if err != nil {
		return backend.Memory{}, false, fmt.Errorf("sandbox %s: memory: %w", id, err)
	}
	return m, true, nil
}

// BulkResult is what PauseMany or ResumeMany did.
type BulkResult struct {
	Done     int
	Before   int64 // resident bytes before a reclaim, summed
	After    int64
	Failures map[string]error // sandbox id -> why
}

// PauseMany pauses (with reclaim: and reclaims) every sandbox carrying
// all of labels that visible accepts; failures are per sandbox.
func (n *Node) PauseMany(ctx context.Context, labels map[string]string, reclaim bool, visible func(string) bool) (BulkResult, error) {
	return n.bulk(ctx, labels, visible, func(sb *Sandbox) bool {
		return sb.Phase == state.PhaseRunning || (reclaim && sb.Phase == state.PhasePaused && !sb.Reclaimed)
	}, func(id string, r *BulkResult, mu *sync.Mutex) error {
		if !reclaim {
			return n.Pause(ctx, id)
		}
		got, err := n.PauseReclaim(ctx, id)
		mu.Lock()
		r.Before += got.Before.ResidentBytes
		r.After += got.After.ResidentBytes
		mu.Unlock()
		return err
	})
}

// ResumeMany resumes every paused sandbox carrying all of labels.
func (n *Node) ResumeMany(ctx context.Context, labels map[string]string, visible func(string) bool) (BulkResult, error) {
	return n.bulk(ctx, labels, visible, func(sb *Sandbox) bool { return sb.Phase == state.PhasePaused },
		func(id string, _ *BulkResult, _ *sync.Mutex) error { return n.Resume(ctx, id) })
}

func (n *Node) bulk(ctx context.Context, labels map[string]string, visible func(string) bool, want func(*Sandbox) bool, do func(string, *BulkResult, *sync.Mutex) error) (BulkResult, error) {
	if len(labels) == 0 {
		return BulkResult{}, errdefs.InvalidArgument("labels: at least one is required (a whole node is never paused by accident)")
	}
	if err := checkLabels(labels); err != nil {
		return BulkResult{}, err
	}
	var ids []string
	for token := ""; ; {
		page, next, err := n.List(ctx, ListFilter{Labels: labels, Visible: visible, PageSize: maxPageSize, PageToken: token})
		if err != nil {
			return BulkResult{}, err
		}
		for _, sb := range page {
			if want(sb) {
				ids = append(ids, sb.ID)
			}
		}
		if token = next; token == "" {
			break
		}
	}
	r := BulkResult{Failures: map[string]error{}}
	var mu sync.Mutex
	inParallel(len(ids), func(i int) {
		err := do(ids[i], &r, &mu)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			r.Failures[ids[i]] = err
		} else {
			r.Done++
		}
	})
	return r, nil
}

// idleAct applies a sandbox's idle action; false means "stop it" (the
// default action).
func (n *Node) idleAct(ctx context.Context, rec *state.Record) bool {
	switch rec.IdleAction {
	case IdlePause:
		if rec.Phase == state.PhaseRunning {
			if err := n.Pause(ctx, rec.ID); err != nil {
				n.log.Error("pause idle sandbox", "sandbox", rec.ID, "err", err)
			}
		}
		return true
	case IdleReclaim:
		if !rec.Reclaimed {
			if _, err := n.PauseReclaim(ctx, rec.ID); err != nil {
				n.log.Error("reclaim idle sandbox", "sandbox", rec.ID, "err", err)
			}
		}
		return true
	}
	return false
}
