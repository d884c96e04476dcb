// Package upper owns a sandbox's writable layer: the Layer a store hands
// out (host directories, or a block device holding an ext4 filesystem),
// where its upper directory can be read from the node (Location), the Store
// interface every writable-layer store implements, and DirStore, the store
// of plain directories without quota. The stores with disk limits are its
// subpackages xfs (XFS project quota) and ext4img (one ext4 image per
// sandbox); the choice among them is the subpackage open, kept apart
// because it imports those stores, which import this package for its types.
//
// It must not import corral packages other than internal/errdefs; in
// particular no backend: the backends import it (internal/deptest).
package upper

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Layer is a sandbox's writable root filesystem layer as a store hands it
// out, in one of two forms:
//
//   - host directories: UpperDir and WorkDir, an overlayfs upper and work
//     dir on one host filesystem (quota, if any, enforced there);
//   - a block device: Device, open, with DevicePath (/dev/loopN), holding an
//     ext4 filesystem that the sandbox mounts inside its own mount namespace
//     (the filesystem's size is the quota). A VM backend can hand the same
//     device to its guest.
type Layer struct {
	UpperDir, WorkDir string
	// Device keeps the loop device attached until the sandbox has mounted
	// it; the caller closes it then, or on failure.
	Device     *os.File
	DevicePath string
}

// IsDevice reports whether the layer is a block device.
func (l Layer) IsDevice() bool { return l.DevicePath != "" }

// Close releases the layer's device fd, if any; it is safe to call twice.
func (l *Layer) Close() error {
	if l.Device == nil {
		return nil
	}
	err := l.Device.Close()
	l.Device = nil
	return err
}

// Location says where a sandbox's upper directory lives, for reading it
// from the node: a host directory (Dir), or the disk image (Image) holding
// it as upper/ at the root of its filesystem.
type Location struct {
	Dir   string
	Image string
	// Scratch, when set, is a fresh path on Dir's filesystem outside
	// every sandbox's quota, where the node may copy the upper directory
	// (reflinked) for a pack; the store removes what is left there at its
	// next open.
	Scratch string
}

// Store provides each sandbox's writable layer, with a disk limit when the
// store enforces one: xfs.Store (XFS project quota, host dirs),
// ext4img.Store (one ext4 image per sandbox, a device) or DirStore.
type Store interface {
	// Create makes the layer of sandbox id. A layer with a Device is the
	// caller's to close once the sandbox has mounted it (or on failure).
	Create(ctx context.Context, id string, blocksBytes, inodes int64) (Layer, error)
	// Remove deletes the layer of sandbox id; no-op if there is none.
	Remove(ctx context.Context, id string) error
	// IDs lists the sandboxes that have a layer (for Sweep).
	IDs() ([]string, error)
	// Locate says where sandbox id's upper directory is (for pack).
	Locate(id string) (Location, error)
	// Close releases what the store holds open. With cleanup (no layer is
	// left) it also takes down what it set up on the host (the XFS pool's
	// mount); without, that stays for the next open (a daemon restart).
	Close(ctx context.Context, cleanup bool) error
}

// Usager is implemented by stores that can tell a layer's use (the XFS
// project quota store); for the others the sandbox's own filesystem tells.
type Usager interface {
	Usage(id string) (bytes, inodes int64, err error)
}

// DirStore is a Store of plain directories under Root, without quota
// (tests and hosts without a quota-capable filesystem).
type DirStore struct{ Root string }

var _ Store = DirStore{}

// Create makes <Root>/<id>/{upper,work}.
func (d DirStore) Create(ctx context.Context, id string, _, _ int64) (Layer, error) {
	base := filepath.Join(d.Root, id)
	upper, work := filepath.Join(base, "upper"), filepath.Join(base, "work")
	if err := os.MkdirAll(d.Root, 0o700); err != nil {
		return Layer{}, fmt.Errorf("upper store: %w", err)
	}
	if err := os.Mkdir(base, 0o700); err != nil {
		return Layer{}, fmt.Errorf("upper store: %w", err)
	}
	for _, p := range []string{upper, work} {
		if err := os.Mkdir(p, 0o755); err != nil {
			os.RemoveAll(base)
			return Layer{}, fmt.Errorf("upper store: %w", err)
		}
	}
	return Layer{UpperDir: upper, WorkDir: work}, nil
}

// Remove deletes <Root>/<id>; a missing directory is not an error.
func (d DirStore) Remove(ctx context.Context, id string) error {
	if err := os.RemoveAll(filepath.Join(d.Root, id)); err != nil {
		return fmt.Errorf("upper store: remove %s: %w", id, err)
	}
	return nil
}

// Locate returns <Root>/<id>/upper once it exists.
func (d DirStore) Locate(id string) (Location, error) {
	upper := filepath.Join(d.Root, id, "upper")
	if _, err := os.Stat(upper); err != nil {
		return Location{}, fmt.Errorf("upper store: %w", err)
	}
	return Location{Dir: upper}, nil
}

// IDs lists the directories under Root.
func (d DirStore) IDs() ([]string, error) {
	ids, err := DirIDs(d.Root)
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("upper store: %w", err)
	}
	return ids, nil
}

// DirIDs lists the layers of a store that keeps one directory per sandbox
// in dir: the directories whose names do not start with '.' (no sandbox id
// does; the stores keep their own things under such names).
func DirIDs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// Close is a no-op: the directories are all there is.
func (DirStore) Close(context.Context, bool) error { return nil }
