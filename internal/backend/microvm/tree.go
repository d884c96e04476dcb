package microvm

import (
	"context"
	"fmt"
	"io"

	"github.com/corral-dev/corral/internal/backend"
)

var _ backend.Trees = (*sandbox)(nil)

// CopyIn implements backend.Trees: the agent extracts the tar stream with
// the same safefs code a container sandbox uses.
func (s *sandbox) CopyIn(ctx context.Context, dir string, r io.Reader) (entries, bytes int64, err error) {
	if err := s.live(); err != nil {
		return 0, 0, err
	}
	entries, bytes, err = s.agent.CopyIn(ctx, dir, r)
	if err != nil {
		return entries, bytes, fmt.Errorf("sandbox %s: copy into %s: %w", s.m.id, dir, err)
	}
	return entries, bytes, nil
}

// CopyOut implements backend.Trees: the agent archives path with safefs
// and streams the tar back.
func (s *sandbox) CopyOut(ctx context.Context, path string, w io.Writer) error {
	if err := s.live(); err != nil {
		return err
	}
	if err := s.agent.CopyOut(ctx, path, w); err != nil {
		return fmt.Errorf("sandbox %s: copy out %s: %w", s.m.id, path, err)
	}
	return nil
}
