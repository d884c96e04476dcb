package container

import (
	"context"
	"fmt"
	"sync"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

var _ backend.Resetter = (*sandbox)(nil)

// poolState is what a resettable or recyclable sandbox keeps between
// calls: one open connection for resets, its cgroup's files held open, and
// the OOM kill count after the last command (calls on a pooled sandbox are
// serial, so the next command's "before" need not be read again). A
// recyclable one also keeps what its next view is made of (recycle.go).
type poolState struct {
	mu      sync.Mutex
	resets  launch.Resetter
	watch   *cgroup.Watch
	oomLast uint64
	// done is the outcome of the reset init did after the last exec
	// (ExecSpec.ThenReset), until a Reset takes it.
	done *launch.ResetOutcome

	// view: the node makes this sandbox's views (Spec.Recyclable), from
	// spec; dirty: the last Scrub found the view written to; base: usage
	// counters at the last Renew, which the sandbox's figures start from.
	view  bool
	spec  backend.Spec
	dirty bool
	base  usageBase
}

// startPool prepares a resettable or recyclable sandbox's pool state.
func (s *sandbox) startPool(spec backend.Spec) error {
	watch, err := s.group.Watch()
	if err != nil {
		return err
	}
	n, err := watch.OOMKills()
	if err != nil {
		watch.Close()
		return err
	}
	s.pool = &poolState{resets: launch.Resetter{Client: s.client}, watch: watch, oomLast: n, view: spec.Recyclable}
	// A pooled init is the Go server itself, for the sandbox's life.
	s.client.ReuseConns()
	if spec.Recyclable {
		s.pool.spec = backend.Spec{ID: spec.ID, Layers: spec.Layers, Resources: spec.Resources, Recyclable: true}
	}
	return nil
}

// stopPool releases the pool state (Stop).
func (s *sandbox) stopPool() {
	if s.pool == nil {
		return
	}
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	s.pool.resets.Close()
	s.pool.watch.Close()
}

// holdReset keeps the outcome of the reset init did after an exec
// (ExecSpec.ThenReset) for the next Reset; nil drops the one kept.
func (s *sandbox) holdReset(r *launch.ResetOutcome) {
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	s.pool.done = r
}

// Reset implements backend.Resetter: init kills every process and, if the
// view was written to, re-mounts it; then the memory peak restarts. After
// an exec with ExecSpec.ThenReset, init did that already (sparing that
// exec's ResetKeep; keep is not used), and its outcome is taken instead.
func (s *sandbox) Reset(ctx context.Context, keep []int) (bool, error) {
	if s.pool == nil {
		return false, errdefs.FailedPrecondition("sandbox %s: reset: not a resettable sandbox", s.id)
	}
	if err := s.live(); err != nil {
		return false, err
	}
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	var dirty bool
	var err error
	if d := s.pool.done; d != nil {
		s.pool.done = nil
		dirty, err = d.Dirty, d.Err
	} else {
		dirty, err = s.pool.resets.Reset(ctx, keep)
	}
	if err != nil {
		return dirty, fmt.Errorf("sandbox %s: reset: %w", s.id, err)
	}
	if err := s.pool.watch.ResetPeak(); err != nil {
		return dirty, fmt.Errorf("sandbox %s: reset: %w", s.id, err)
	}
	return dirty, nil
}

// MemoryPeak implements backend.Resetter.
func (s *sandbox) MemoryPeak() (int64, error) {
	if s.pool == nil {
		return 0, errdefs.FailedPrecondition("sandbox %s: memory peak: not a resettable sandbox", s.id)
	}
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	return s.pool.watch.Peak()
}

// OOMKills implements backend.Resetter.
func (s *sandbox) OOMKills() (uint64, error) {
	return s.ooms(func(p *poolState) (uint64, error) { return p.watch.OOMKills() })
}

// oomBefore is the sandbox's OOM kill count before a command.
func (s *sandbox) oomBefore() (uint64, error) {
	return s.ooms(func(p *poolState) (uint64, error) { return p.oomLast, nil })
}

// oomAfter is the count after a command.
func (s *sandbox) oomAfter() (uint64, error) {
	return s.ooms(func(p *poolState) (uint64, error) {
		n, err := p.watch.OOMKills()
		if err == nil {
			p.oomLast = n
		}
		return n, err
	})
}

// ooms runs read on the pool under its lock; a sandbox of no pool counts its
// own cgroup's OOM kills.
func (s *sandbox) ooms(read func(*poolState) (uint64, error)) (uint64, error) {
	if s.pool == nil {
		return s.group.OOMKills()
	}
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	return read(s.pool)
}
