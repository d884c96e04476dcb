package container

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

var _ backend.Reclaimer = (*sandbox)(nil)

// Reclaim implements backend.Reclaimer: the frozen group's anonymous
// memory goes to the node's swap area, its clean page cache is dropped;
// pages come back when a thawed process touches them.
func (s *sandbox) Reclaim(_ context.Context, swap bool) (before, after backend.Memory, err error) {
	if err := s.live(); err != nil {
		return before, after, err
	}
	if !swap {
		return before, after, errdefs.FailedPrecondition("sandbox %s: pause --reclaim: the node has no swap area to push memory to (start corral serve with --swap SIZE)", s.id)
	}
	b, a, err := s.group.Reclaim()
	if err != nil {
		return before, after, fmt.Errorf("sandbox %s: %w", s.id, err)
	}
	return backend.Memory(b), backend.Memory(a), nil
}

// Memory implements backend.Reclaimer.
func (s *sandbox) Memory(context.Context) (backend.Memory, error) {
	m, err := s.group.Memory()
	return backend.Memory(m), err
}
