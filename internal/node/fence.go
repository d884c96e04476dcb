package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/state"
)

// A migration fences the sandbox it moves (SnapshotFenced): the VM is
// paused right after its snapshot and every call to it here but Get,
// List and the migration's own Delete is refused, so nothing changes the
// original after the instant the target resumes from. The fence ends by
// LiftFence (the migration failed: the sandbox resumes, unless it was
// paused before), by its lapse
// (the control instance died: it resumes, logged), by a restart of this
// node (a mark file says which sandboxes to resume), or — once held
// (HoldFence, before the routing switch) — by the sandbox's Delete.

const (
	// DefaultFenceLapse and MaxFenceLapse bound how long a fence lasts
	// unless held.
	DefaultFenceLapse = 10 * time.Minute
	MaxFenceLapse     = time.Hour
)

// fence is one migration's hold on a sandbox; held and paused change
// under the entry's mu.
type fence struct {
	target string
	timer  *time.Timer
	held   bool // the migration switches: no lapse, Delete accepted
	paused bool // the fence paused the VM (and so resumes it)
	// wasPaused: the sandbox was paused before the fence, and stays so
	// when the fence ends.
	wasPaused bool
}

// fenceMark is a fence's file under fenceRoot, read after a restart.
type fenceMark struct {
	Target    string `json:"target"`
	WasPaused bool   `json:"was_paused,omitempty"`
}

func (f *fence) refusal(id string) error {
	return errdefs.Unavailable("sandbox %s is migrating to node %s; retry", id, f.target)
}

func (n *Node) fenceRoot() string { return filepath.Join(n.cfg.DataDir, "fences") }

// SnapshotFenced snapshots sandbox id for its migration to node target
// and leaves it fenced (see above) for at most lapse (0: the default)
// unless held.
func (n *Node) SnapshotFenced(ctx context.Context, id, target string, lapse time.Duration) (*SnapshotInfo, error) {
	switch {
	case target == "":
		return nil, errdefs.InvalidArgument("target_node: required")
	case lapse < 0 || lapse > MaxFenceLapse:
		return nil, errdefs.InvalidArgument("lapse: %s is out of range (0 for the default %s, at most %s)", lapse, DefaultFenceLapse, MaxFenceLapse)
	case lapse == 0:
		lapse = DefaultFenceLapse
	}
	e, err := n.lookup(id)
	if err != nil {
		return nil, err
	}
	f := &fence{target: truncate(target), wasPaused: e.snapshot().Phase == state.PhasePaused}
	if err := n.writeFenceMark(id, fenceMark{Target: f.target, WasPaused: f.wasPaused}); err != nil {
		return nil, err
	}
	e.mu.Lock()
	if old := e.fence.Load(); old != nil {
		e.mu.Unlock()
		return nil, old.refusal(id)
	}
	e.fence.Store(f)
	e.mu.Unlock()
	n.log.Info("sandbox fenced for its migration", "sandbox", id, "to", f.target, "lapse", lapse)
	info, err := n.snapshotEntry(ctx, e, id, f)
	if err != nil {
		n.unfence(context.WithoutCancel(ctx), e, id, f, "its snapshot failed")
		return nil, err
	}
	e.mu.Lock()
	f.timer = time.AfterFunc(lapse, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		n.unfence(ctx, e, id, f, fmt.Sprintf("its fence lapsed after %s without the routing switch (the control instance may have died)", lapse))
	})
	e.mu.Unlock()
	return info, nil
}

// fencePause pauses e right after its fenced snapshot.
func (n *Node) fencePause(ctx context.Context, e *entry, f *fence) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sb == nil || e.rec.Phase != state.PhaseRunning {
		return errdefs.FailedPrecondition("sandbox %s stopped during its snapshot", e.rec.ID)
	}
	if err := e.sb.Pause(ctx); err != nil {
		return fmt.Errorf("pause sandbox %s after its snapshot: %w", e.rec.ID, err)
	}
	f.paused = true
	e.rec.Phase = state.PhasePaused
	n.putLocked(e)
	n.emit(e.snapshotLocked(), events.Paused, "fenced for its migration to node "+f.target, nil)
	return nil
}

// HoldFence makes sandbox id's fence permanent (its migration switches).
func (n *Node) HoldFence(_ context.Context, id string) error {
	e, err := n.lookupAny(id)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	f := e.fence.Load()
	if f == nil || f.timer == nil {
		return errdefs.FailedPrecondition("sandbox %s is not fenced (its fence lapsed or was lifted, and it ran on after the snapshot): the migration must not switch", id)
	}
	f.held = true
	f.timer.Stop()
	return nil
}

// LiftFence ends sandbox id's fence and resumes it unless it was paused
// before (nothing when it has none).
func (n *Node) LiftFence(ctx context.Context, id string) error {
	e, err := n.lookupAny(id)
	if err != nil {
		return err
	}
	if f := e.fence.Load(); f != nil {
		n.unfence(ctx, e, id, f, "its migration failed")
	}
	return nil
}

// unfence ends fence f of e (if it is still e's) and resumes what it
// paused.
func (n *Node) unfence(ctx context.Context, e *entry, id string, f *fence, why string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.fence.CompareAndSwap(f, nil) {
		return
	}
	if f.timer != nil {
		f.timer.Stop()
	}
	n.removeFenceMark(id)
	n.log.Warn("migration fence ended; the original goes on as before", "sandbox", id, "to", f.target, "reason", why)
	if !f.paused || f.wasPaused || e.deleting || e.sb == nil || e.rec.Phase != state.PhasePaused {
		return
	}
	if err := e.sb.Resume(ctx); err != nil {
		// It stays paused; the next call resumes it as any paused one.
		n.log.Error("resume sandbox after its fence", "sandbox", id, "err", err)
		return
	}
	e.rec.Phase = state.PhaseRunning
	e.rec.Reclaimed, e.rec.ReclaimedResident = false, 0
	n.putLocked(e)
	n.emit(e.snapshotLocked(), events.Resumed, "its migration fence ended: "+why, nil)
}

// writeFenceMark records on disk that sandbox id is fenced, so that a
// restart resumes it (dropFences).
func (n *Node) writeFenceMark(id string, m fenceMark) error {
	if err := os.MkdirAll(n.fenceRoot(), 0o700); err != nil {
		return fmt.Errorf("fence sandbox %s: %w", id, err)
	}
	if err := writeFileSync(filepath.Join(n.fenceRoot(), id), m); err != nil {
		return fmt.Errorf("fence sandbox %s: %w", id, err)
	}
	return nil
}

func (n *Node) removeFenceMark(id string) {
	if err := os.Remove(filepath.Join(n.fenceRoot(), id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		n.log.Error("remove a fence mark", "sandbox", id, "err", err)
	}
}

// dropFences resumes the sandboxes that were fenced when the previous
// run ended: fences live in memory only, and a migration whose node
// restarted cannot rely on its source staying still.
func (n *Node) dropFences(ctx context.Context) {
	ents, err := os.ReadDir(n.fenceRoot())
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			n.log.Error("read fence marks", "err", err)
		}
		return
	}
	for _, d := range ents {
		id := d.Name()
		var m fenceMark
		raw, err := readBounded(filepath.Join(n.fenceRoot(), id), maxRecordBytes)
		if err == nil {
			err = json.Unmarshal(raw, &m)
		}
		if err != nil {
			n.log.Warn("unreadable fence mark; resuming the sandbox", "sandbox", id, "err", err)
		}
		if e, err := n.lookupAny(id); err == nil && !m.WasPaused && e.snapshot().Phase == state.PhasePaused {
			if err := n.Resume(ctx, id); err != nil {
				n.log.Error("resume a sandbox fenced before the restart", "sandbox", id, "err", err)
			} else {
				n.log.Warn("a migration's fence ended with the restart; the sandbox resumed", "sandbox", id)
			}
		}
		n.removeFenceMark(id)
	}
}
