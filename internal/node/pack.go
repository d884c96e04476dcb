package node

import (
	"context"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/state"
	"github.com/corral-dev/corral/internal/storage/layers"
)

// PackRequest asks to turn a sandbox's writable layer into a layer.
type PackRequest struct {
	ID string
	layers.PackOptions
	// NoComposition makes only the layer; by default a composition of the
	// same name stacks it on the sandbox's own layers.
	NoComposition bool
}

// PackResult is what Pack made.
type PackResult struct {
	Layer layers.Layer
	// Composition is empty with PackRequest.NoComposition.
	Composition layers.Composition
}

// Pack turns sandbox id's upper directory into the layer req.Ref and
// (unless NoComposition) records the composition req.Ref: the sandbox's
// layers, pinned, with the new one on top, from which new sandboxes start
// where this one is now. A running sandbox is frozen only while its upper
// directory is copied (a reflink copy where the disk store can), so the
// layer is one consistent moment; the layer is then built from the copy
// while the sandbox runs and serves execs. A stopped sandbox (its
// writable layer kept until deleted) packs as it was when it stopped.
func (n *Node) Pack(ctx context.Context, req PackRequest) (*PackResult, error) {
	if err := layers.CheckPackOptions(req.PackOptions); err != nil {
		return nil, err
	}
	if err := n.cfg.Images.CheckFree(req.Ref); err != nil {
		return nil, err
	}
	e, err := n.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	snap, ok := e.backend.(backend.UpperSnapshotter)
	if !ok {
		return nil, errdefs.NotSupported("pack: backend %s cannot read a sandbox's writable layer", e.backend.Name())
	}
	e.mu.Lock()
	if e.deleting {
		e.mu.Unlock()
		return nil, errdefs.NotFound("sandbox %s is being deleted", req.ID)
	}
	if e.packing != nil {
		e.mu.Unlock()
		return nil, errdefs.FailedPrecondition("pack: sandbox %s is being packed already", req.ID)
	}
	rec := e.snapshotLocked()
	if !req.NoComposition && len(rec.Layers) == 0 {
		e.mu.Unlock()
		return nil, errdefs.FailedPrecondition("pack: sandbox %s was made by an earlier version and names no layers; pack with no composition", req.ID)
	}
	// The pack runs without the sandbox's lock: a delete cancels it (and
	// waits for it), and other requests are not queued behind the lock.
	// Its work is bounded by what the sandbox stored (image.Store.Pack
	// refuses sparse trees).
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	e.packing, e.packCancel = done, cancel
	sb := e.sb
	running := rec.Phase == state.PhaseRunning
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.packing, e.packCancel = nil, nil
		e.mu.Unlock()
		cancel()
		close(done)
	}()
	dir, remove, err := n.snapshotUpper(ctx, e, rec, sb, snap, running)
	if err != nil {
		return nil, fmt.Errorf("pack sandbox %s: %w", req.ID, err)
	}
	l, err := n.cfg.Images.Pack(ctx, dir, req.PackOptions)
	if rerr := remove(); rerr != nil {
		n.log.Warn("remove a pack's snapshot", "sandbox", req.ID, "err", rerr)
	}
	if err != nil {
		return nil, fmt.Errorf("pack sandbox %s: %w", req.ID, err)
	}
	e.touch()
	out := &PackResult{Layer: l}
	if req.NoComposition {
		return out, nil
	}
	c, err := layers.PackComposition(req.Ref, imageLayers(rec.Layers), rec.Env)
	if err == nil {
		out.Composition, err = n.cfg.Images.CreateComposition(ctx, c)
	}
	if err != nil {
		return nil, fmt.Errorf("pack sandbox %s: layer %s made, composition failed: %w", req.ID, l.Ref, err)
	}
	return out, nil
}

// snapshotUpper copies the upper directory of sandbox rec (entry e, live
// sandbox sb), frozen around the copy when it runs; it is thawed after
// unless a delete came meanwhile.
func (n *Node) snapshotUpper(ctx context.Context, e *entry, rec *state.Record, sb backend.Sandbox, snap backend.UpperSnapshotter, running bool) (string, func() error, error) {
	id := rec.ID
	if running {
		if err := sb.Pause(ctx); err != nil {
			return "", nil, fmt.Errorf("pause: %w", err)
		}
		defer func() {
			e.mu.Lock()
			resume := e.sb != nil && !e.deleting
			e.mu.Unlock()
			if resume {
				if err := sb.Resume(context.WithoutCancel(ctx)); err != nil {
					n.log.Error("resume sandbox after a pack's snapshot", "sandbox", id, "err", err)
				}
			}
		}()
	}
	start := time.Now()
	dir, remove, err := snap.SnapshotUpper(ctx, rec.BackendName())
	if err != nil {
		return "", nil, err
	}
	n.log.Debug("pack snapshot", "sandbox", id, "frozen", running, "took", time.Since(start))
	return dir, remove, nil
}
