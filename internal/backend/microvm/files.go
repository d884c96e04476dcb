package microvm

import (
	"context"
	"fmt"
	"io"
	"io/fs"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// The file operations run in the guest: the agent applies safefs to its
// own root, so paths resolve exactly as for a container sandbox.

// fileErr adds the sandbox, op and path to an agent error.
func (s *sandbox) fileErr(op, path string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("sandbox %s: %s %s: %w", s.m.id, op, path, err)
}

func (s *sandbox) WriteFile(ctx context.Context, path string, r io.Reader, opts backend.WriteOptions) (int64, error) {
	if err := s.Serving(); err != nil {
		return 0, err
	}
	n, err := s.agent.WriteFile(ctx, path, r, opts)
	return n, s.fileErr(agentproto.OpWrite, path, err)
}

func (s *sandbox) ReadFile(ctx context.Context, path string, offset, limit int64) (io.ReadCloser, error) {
	if err := s.Serving(); err != nil {
		return nil, err
	}
	rc, err := s.agent.ReadFile(ctx, path, offset, limit)
	return rc, s.fileErr(agentproto.OpRead, path, err)
}

func (s *sandbox) ListDir(ctx context.Context, path string) ([]backend.FileInfo, error) {
	if err := s.Serving(); err != nil {
		return nil, err
	}
	out, err := s.agent.ListDir(ctx, path)
	return out, s.fileErr(agentproto.OpList, path, err)
}

func (s *sandbox) Stat(ctx context.Context, path string) (backend.FileInfo, error) {
	if err := s.Serving(); err != nil {
		return backend.FileInfo{}, err
	}
	fi, err := s.agent.Stat(ctx, path)
	return fi, s.fileErr(agentproto.OpStat, path, err)
}

func (s *sandbox) Remove(ctx context.Context, path string, recursive bool) error {
	if err := s.Serving(); err != nil {
		return err
	}
	return s.fileErr(agentproto.OpRemove, path, s.agent.Remove(ctx, path, recursive))
}

func (s *sandbox) MakeDir(ctx context.Context, path string, mode fs.FileMode, parents bool) error {
	if err := s.Serving(); err != nil {
		return err
	}
	return s.fileErr(agentproto.OpMkdir, path, s.agent.MakeDir(ctx, path, mode, parents))
}
