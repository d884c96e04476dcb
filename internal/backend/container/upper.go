package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// UpperStore provides each sandbox's writable layer (upper and work dirs on
// one filesystem), with a disk quota when the store enforces one.
type UpperStore interface {
	Create(ctx context.Context, id string, blocksBytes, inodes int64) (upperDir, workDir string, err error)
	Remove(ctx context.Context, id string) error
}

// DirStore is an UpperStore of plain directories under Root, without quota
// (tests and hosts without a quota-capable filesystem).
type DirStore struct{ Root string }

// Create makes <Root>/<id>/{upper,work}.
func (d DirStore) Create(ctx context.Context, id string, _, _ int64) (string, string, error) {
	base := filepath.Join(d.Root, id)
	upper, work := filepath.Join(base, "upper"), filepath.Join(base, "work")
	if err := os.MkdirAll(d.Root, 0o700); err != nil {
		return "", "", fmt.Errorf("upper store: %w", err)
	}
	if err := os.Mkdir(base, 0o700); err != nil {
		return "", "", fmt.Errorf("upper store: %w", err)
	}
	for _, p := range []string{upper, work} {
		if err := os.Mkdir(p, 0o755); err != nil {
			os.RemoveAll(base)
			return "", "", fmt.Errorf("upper store: %w", err)
		}
	}
	return upper, work, nil
}

// Remove deletes <Root>/<id>; a missing directory is not an error.
func (d DirStore) Remove(ctx context.Context, id string) error {
	if err := os.RemoveAll(filepath.Join(d.Root, id)); err != nil {
		return fmt.Errorf("upper store: remove %s: %w", id, err)
	}
	return nil
}
