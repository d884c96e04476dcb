package container

import (
	"context"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// A recyclable sandbox (backend.Spec.Recyclable) is a container sandbox
// whose init runs in pool mode with the node's overlay as its view: every
// command is chrooted into that view by init's forking thread, so that the
// view can be swapped under a live init. Scrub is init's reset (every
// process killed, IPC objects and message queues removed, the PID counter
// rewound, the view's writable filesystems compared with their empty
// state); Renew, when the view was written to, makes the next one exactly
// as Create made the first (a new disk from the store's template with the
// sandbox's disk and I/O limits, an overlay on the same idmapped layers)
// and hands it to init, which detached the old one.

var _ backend.Recycler = (*sandbox)(nil)

// usageBase are the cumulative cgroup counters at the last Renew.
type usageBase struct {
	cpu  time.Duration
	ooms uint64
}

// viewSteps make the next view of a recyclable sandbox: the create steps
// that concern its writable layer.
var viewSteps = []backend.Step[*creation]{
	{Name: "upper", Run: (*creation).makeUpper},
	{Name: "io", Run: (*creation).limitIO},
	{Name: "mounts", Run: (*creation).makeMounts},
}

// recyclable returns the pool state of a recyclable sandbox.
func (s *sandbox) recyclable() (*poolState, error) {
	if !s.Recyclable() {
		return nil, errdefs.FailedPrecondition("sandbox %s: not a recyclable sandbox", s.id)
	}
	return s.pool, s.live()
}

// Recyclable implements backend.Recycler.
func (s *sandbox) Recyclable() bool { return s.pool != nil && s.pool.view }

// Scrub implements backend.Recycler.
func (s *sandbox) Scrub(ctx context.Context) error {
	p, err := s.recyclable()
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	dirty, err := p.resets.Reset(ctx, nil)
	if err != nil {
		return fmt.Errorf("sandbox %s: scrub: %w", s.id, err)
	}
	p.dirty = dirty
	return nil
}

// Renew implements backend.Recycler.
func (s *sandbox) Renew(ctx context.Context) error {
	p, err := s.recyclable()
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dirty {
		timings, err := s.renewView(ctx, p)
		if err != nil {
			return fmt.Errorf("sandbox %s: renew: %w", s.id, err)
		}
		p.dirty = false
		s.b.log.Debug("sandbox view renewed", append([]any{"sandbox", s.id}, timings...)...)
	}
	if err := p.watch.ResetPeak(); err != nil {
		return fmt.Errorf("sandbox %s: renew: %w", s.id, err)
	}
	cpu, err := p.watch.CPUUsage()
	if err != nil {
		return fmt.Errorf("sandbox %s: renew: %w", s.id, err)
	}
	ooms, err := p.watch.OOMKills()
	if err != nil {
		return fmt.Errorf("sandbox %s: renew: %w", s.id, err)
	}
	p.base, p.oomLast = usageBase{cpu: cpu, ooms: ooms}, ooms
	return nil
}

// renewView replaces the view Scrub detached with a fresh one; it returns
// how long each part took, for a debug log.
func (s *sandbox) renewView(ctx context.Context, p *poolState) ([]any, error) {
	start := time.Now()
	// The old disk is let go once the kernel has unmounted the detached
	// view (init's forking thread, rooted in it, ended with the reset);
	// Remove waits for its loop device to detach.
	if err := s.b.cfg.Uppers.Remove(ctx, s.id); err != nil {
		return nil, err
	}
	timings := []any{"remove", time.Since(start)}
	c := &creation{b: s.b, spec: p.spec, dir: s.b.runDir(s.id), group: s.group, proc: s.proc, ids: s.ids}
	steps, err := backend.RunSteps(ctx, c, viewSteps, &c.undo, failStep)
	if err != nil {
		return nil, err
	}
	defer c.layer.Close()
	defer closeAll(c.mounts)
	start = time.Now()
	if err := p.resets.Renew(ctx, c.mounts[0]); err != nil {
		c.undo.Run()
		return nil, err
	}
	return append(append(timings, steps...), "attach", time.Since(start)), nil
}

// since is the usage counters' base of a recycled sandbox (zero for others),
// which its figures start from.
func (s *sandbox) since() usageBase {
	if s.pool == nil {
		return usageBase{}
	}
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	return s.pool.base
}
