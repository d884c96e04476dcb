package vm

import (
	"context"
	"io"

	"github.com/corral-dev/corral/internal/backend"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/errdefs"
)

var _ backend.Trees = (*sandbox)(nil)

// Trees of a vm sandbox go through corral-agent's extract and archive
// ops, which run the same safefs code as a microVM's agent and a
// container's node (the same escape checks, refusals and error texts).
// qemu-ga takes stdin whole and returns output at the end, so images
// without corral-agent offer no tree copy.

func (s *sandbox) treesOK() error {
	if err := s.Serving(); err != nil {
		return err
	}
	if s.agent == nil {
		return errdefs.NotSupported("sandbox %s: copying directory trees needs corral-agent in the VM image (images from vm-image build have it); copy single files", s.m.id)
	}
	return nil
}

// CopyIn implements backend.Trees: the agent extracts the tar stream.
func (s *sandbox) CopyIn(ctx context.Context, dir string, r io.Reader) (entries, bytes int64, err error) {
	if err := s.treesOK(); err != nil {
		return 0, 0, err
	}
	return qemuvm.CopyIn(ctx, s.m.id, s.agent.Client, dir, r)
}

// CopyOut implements backend.Trees: the agent archives path and streams
// the tar back.
func (s *sandbox) CopyOut(ctx context.Context, path string, w io.Writer) error {
	if err := s.treesOK(); err != nil {
		return err
	}
	return qemuvm.CopyOut(ctx, s.m.id, s.agent.Client, path, w)
}
