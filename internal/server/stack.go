package server

import (
	"context"
	"path/filepath"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/backend/container"
	"github.com/corral-dev/corral/internal/quota"
)

// stack is the node-local machinery below the node: the disk-quota store
// for writable layers and the backends built on it.
type stack struct {
	uppers   *quota.Store
	backends []backend.Backend
}

func newStack(ctx context.Context, cfg Config) (*stack, error) {
	uppers, err := quota.Open(ctx, quota.Config{
		Dir:       filepath.Join(cfg.DataDir, "disk"),
		SizeBytes: cfg.DiskPoolBytes,
	})
	var upperStore container.UpperStore = uppers
	if err != nil {
		cfg.Logger.Error("TEMP: disk pool unavailable, writable layers without quota", "err", err)
		upperStore = container.DirStore{Root: filepath.Join(cfg.DataDir, "uppers")}
		uppers = nil
	}
	ctr, err := container.New(container.Config{
		RunDir:       filepath.Join(cfg.DataDir, "run"),
		CgroupParent: cfg.CgroupParent,
		InitPath:     cfg.InitBinary,
		Uppers:       upperStore,
		Logger:       cfg.Logger,
	})
	if err != nil {
		if uppers != nil {
			uppers.Close(ctx, false)
		}
		return nil, err
	}
	return &stack{uppers: uppers, backends: []backend.Backend{ctr}}, nil
}

// close releases the stack; unmount also detaches the disk pool (only when
// no sandbox is left).
func (s *stack) close(ctx context.Context, unmount bool) error {
	if s.uppers == nil {
		return nil
	}
	return s.uppers.Close(ctx, unmount)
}
