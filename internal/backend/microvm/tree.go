package microvm

import (
	"context"
	"io"

	"github.com/corral-dev/corral/internal/backend"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
)

var _ backend.Trees = (*sandbox)(nil)

// CopyIn implements backend.Trees: the agent extracts the tar stream with
// the same safefs code a container sandbox uses.
func (s *sandbox) CopyIn(ctx context.Context, dir string, r io.Reader) (entries, bytes int64, err error) {
	if err := s.Serving(); err != nil {
		return 0, 0, err
	}
	return qemuvm.CopyIn(ctx, s.m.id, s.agent, dir, r)
}

// CopyOut implements backend.Trees: the agent archives path with safefs
// and streams the tar back.
func (s *sandbox) CopyOut(ctx context.Context, path string, w io.Writer) error {
	if err := s.Serving(); err != nil {
		return err
	}
	return qemuvm.CopyOut(ctx, s.m.id, s.agent, path, w)
}
