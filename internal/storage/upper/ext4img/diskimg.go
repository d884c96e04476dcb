// Package ext4img is the writable-layer store (upper.Store) of per-sandbox
// disk images: for each sandbox one small ext4 filesystem in a sparse image
// file (<dir>/<id>.img), copied from a template formatted once per (size,
// inodes) class (<dir>/.templates), and attached to a loop device with
// autoclear. The filesystem's size and inode
// count are the sandbox's disk limits; it is meant to be mounted by the
// sandbox's init inside the sandbox's own mount namespace, so that no host
// mount exists per sandbox: when the namespace goes, the filesystem is
// unmounted and the loop device detaches itself. This is the disk-limit
// mechanism for hosts without XFS project quota (see internal/storage/upper/xfs).
//
// Everything the store knows it reads back from the directory (ids are file
// names), so a daemon restart just reopens it. It must not import corral
// packages other than internal/storage/upper (the Layer type),
// internal/errdefs, internal/storage/upper/loopdev and internal/backend
// (CheckID, the sandbox id rule).
package ext4img

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// Limits Create accepts.
const (
	MinBytes  = 1 << 20
	MaxBytes  = 8 << 40 // well below the host's largest file (ext4: 16 TiB)
	MinInodes = 16
	MaxInodes = 1 << 31 // ext4 counts inodes in 32 bits
)

const (
	imageExt     = ".img"
	tmpExt       = ".tmp"
	templatesDir = ".templates" // ids cannot start with '.'
)

// Config says where the store lives.
type Config struct {
	// Dir holds the images and their templates. It must be on a local
	// filesystem; it is created if missing.
	Dir string
}

// Store hands out per-sandbox disk images. Its methods are safe for
// concurrent use.
type Store struct {
	dir  string // absolute, symlinks resolved (as loop devices report it)
	mkfs string

	mu        sync.Mutex
	templates map[class]*template
	// devices remembers the loop device each image was attached to, so that
	// Remove checks that one device instead of scanning every loop device
	// (O(sandboxes) per delete). It is empty after a restart: Remove then
	// scans.
	devices map[string]string

	noReflink atomic.Bool // FICLONE failed once: the host fs cannot
	mkfsRuns  atomic.Int64
}

// Open checks the host (mkfs.ext4, loop devices), creates cfg.Dir if needed
// and removes the temporary files a crash may have left.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Dir == "" {
		return nil, errdefs.InvalidArgument("disk image dir: must not be empty")
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		return nil, errdefs.NotSupported("disk images: needs mkfs.ext4 (package e2fsprogs)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return nil, errdefs.NotSupported("disk images: needs loop devices (/dev/loop-control, CONFIG_BLK_DEV_LOOP): %v", err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, templatesDir), 0o700); err != nil {
		return nil, fmt.Errorf("disk image dir: %w", err)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err == nil {
		dir, err = filepath.EvalSymlinks(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("disk image dir %s: %w", cfg.Dir, err)
	}
	s := &Store{dir: dir, mkfs: mkfs, templates: map[class]*template{}, devices: map[string]string{}}
	for _, d := range []string{dir, filepath.Join(dir, templatesDir)} {
		if err := removeTmp(d); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// removeTmp deletes the *.tmp files in dir: images a crash left half-made.
func removeTmp(dir string) error {
	tmps, err := filepath.Glob(filepath.Join(dir, "*"+tmpExt))
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	for _, p := range tmps {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove leftover %s: %w", p, err)
		}
	}
	return nil
}

// IDs lists the ids of the images in the store.
func (s *Store) IDs() ([]string, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list disk images: %w", err)
	}
	var ids []string
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), imageExt)
		if ok && e.Type().IsRegular() && backend.CheckID(id) == nil {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func (s *Store) imagePath(id string) string { return filepath.Join(s.dir, id+imageExt) }

func checkLimits(bytes, inodes int64) error {
	switch {
	case bytes < MinBytes:
		return errdefs.InvalidArgument("disk: %d bytes is below the minimum of %d", bytes, int64(MinBytes))
	case bytes > MaxBytes:
		return errdefs.InvalidArgument("disk: %d bytes is over the maximum of %d", bytes, int64(MaxBytes))
	case inodes < MinInodes:
		return errdefs.InvalidArgument("disk inodes: %d is below the minimum of %d", inodes, int64(MinInodes))
	case inodes > MaxInodes:
		return errdefs.InvalidArgument("disk inodes: %d is over the maximum of %d", inodes, int64(MaxInodes))
	}
	return nil
}
