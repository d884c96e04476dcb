package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/corral-dev/corral/internal/backend"
)

// WritableLayer is what an UpperStore hands out: host upper and work dirs,
// or a block device with an ext4 filesystem that init mounts inside the
// sandbox (see backend.WritableLayer).
type WritableLayer = backend.WritableLayer

// UpperStore provides each sandbox's writable layer, with a disk limit when
// the store enforces one: internal/storage/upper/xfs (XFS project quota, host dirs),
// internal/storage/upper/ext4img (one ext4 image per sandbox, a device) or DirStore.
type UpperStore interface {
	// Create makes the layer of sandbox id. A layer with a Device is the
	// caller's to close once init has mounted it (or on failure).
	Create(ctx context.Context, id string, blocksBytes, inodes int64) (WritableLayer, error)
	// Remove deletes the layer of sandbox id; no-op if there is none.
	Remove(ctx context.Context, id string) error
	// IDs lists the sandboxes that have a layer (for Sweep).
	IDs() ([]string, error)
	// Locate says where sandbox id's upper directory is (for pack).
	Locate(id string) (backend.UpperLocation, error)
}

// DirStore is an UpperStore of plain directories under Root, without quota
// (tests and hosts without a quota-capable filesystem).
type DirStore struct{ Root string }

// Create makes <Root>/<id>/{upper,work}.
func (d DirStore) Create(ctx context.Context, id string, _, _ int64) (WritableLayer, error) {
	base := filepath.Join(d.Root, id)
	upper, work := filepath.Join(base, "upper"), filepath.Join(base, "work")
	if err := os.MkdirAll(d.Root, 0o700); err != nil {
		return WritableLayer{}, fmt.Errorf("upper store: %w", err)
	}
	if err := os.Mkdir(base, 0o700); err != nil {
		return WritableLayer{}, fmt.Errorf("upper store: %w", err)
	}
	for _, p := range []string{upper, work} {
		if err := os.Mkdir(p, 0o755); err != nil {
			os.RemoveAll(base)
			return WritableLayer{}, fmt.Errorf("upper store: %w", err)
		}
	}
	return WritableLayer{UpperDir: upper, WorkDir: work}, nil
}

// Remove deletes <Root>/<id>; a missing directory is not an error.
func (d DirStore) Remove(ctx context.Context, id string) error {
	if err := os.RemoveAll(filepath.Join(d.Root, id)); err != nil {
		return fmt.Errorf("upper store: remove %s: %w", id, err)
	}
	return nil
}

// Locate returns <Root>/<id>/upper.
func (d DirStore) Locate(id string) (backend.UpperLocation, error) {
	return locateDir(filepath.Join(d.Root, id, "upper"))
}

// locateDir checks that an upper directory exists.
func locateDir(upper string) (backend.UpperLocation, error) {
	if _, err := os.Stat(upper); err != nil {
		return backend.UpperLocation{}, fmt.Errorf("upper store: %w", err)
	}
	return backend.UpperLocation{Dir: upper}, nil
}

// IDs lists the directories under Root.
func (d DirStore) IDs() ([]string, error) {
	ents, err := os.ReadDir(d.Root)
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("upper store: %w", err)
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}
