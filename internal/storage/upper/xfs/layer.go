package xfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/upper"
	"golang.org/x/sys/unix"
)

var _ upper.Store = (*Store)(nil)

const dirFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

// Create makes the writable layer of sandbox id: <uppers>/<id>/{upper,work},
// charged to a fresh XFS project limited to blocksBytes bytes and inodes
// inodes (hard limits; writes past them fail with ENOSPC). The layer's
// UpperDir and WorkDir are for an overlayfs mount. On error nothing of the
// layer remains.
func (s *Store) Create(ctx context.Context, id string, blocksBytes, inodes int64) (upper.Layer, error) {
	dir, work, err := s.create(ctx, id, blocksBytes, inodes)
	return upper.Layer{UpperDir: dir, WorkDir: work}, err
}

func (s *Store) create(ctx context.Context, id string, blocksBytes, inodes int64) (upperDir, workDir string, err error) {
	if err := backend.CheckID(id); err != nil {
		return "", "", err
	}
	if err := checkLimits(blocksBytes, inodes); err != nil {
		return "", "", err
	}
	if err := ctx.Err(); err != nil {
		return "", "", fmt.Errorf("layer %s: %w", id, err)
	}
	done, err := s.enter()
	if err != nil {
		return "", "", err
	}
	defer done()

	projid, err := s.allocProject()
	if err != nil {
		return "", "", fmt.Errorf("layer %s: %w", id, err)
	}
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	undo = append(undo, func() { s.ids.release(projid) })

	if err := unix.Mkdirat(s.rootFd, id, 0o700); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return "", "", errdefs.AlreadyExists("layer %s: already exists", id)
		}
		return "", "", fmt.Errorf("layer %s: mkdir: %w", id, err)
	}
	dir := filepath.Join(s.mnt, id)
	undo = append(undo, func() { _ = os.RemoveAll(dir) })
	fd, err := unix.Openat(s.rootFd, id, dirFlags, 0)
	if err != nil {
		return "", "", fmt.Errorf("layer %s: open: %w", id, err)
	}
	defer unix.Close(fd)
	// Project id before limits: the limits are then never on an id
	// without a directory; a crash in between leaves a directory without
	// limits, which IDs lists and the node's sweep removes.
	if err := setProjectID(fd, projid); err != nil {
		return "", "", fmt.Errorf("layer %s: %w", id, err)
	}
	if err := setLimits(s.rootFd, projid, blocksBytes, inodes+layoutInodes); err != nil {
		return "", "", fmt.Errorf("layer %s: %w", id, err)
	}
	undo = append(undo, func() { _ = setLimits(s.rootFd, projid, 0, 0) })
	if err := unix.Mkdirat(fd, "upper", 0o755); err != nil {
		return "", "", fmt.Errorf("layer %s: mkdir upper: %w", id, err)
	}
	if err := unix.Mkdirat(fd, "work", 0o700); err != nil {
		return "", "", fmt.Errorf("layer %s: mkdir work: %w", id, err)
	}
	return filepath.Join(dir, "upper"), filepath.Join(dir, "work"), nil
}

// Remove deletes the layer of sandbox id and clears its limits; it is a
// no-op for an id that does not exist. Call it once nothing uses the layer
// any more (no overlay mounted on it, no process holding a file open in it).
//
// The layer is first renamed into a trash dir, so it vanishes from IDs at
// once and a crash mid-delete is finished by the next Open. Deletion runs to
// completion even if ctx is cancelled, so nothing is left behind.
func (s *Store) Remove(ctx context.Context, id string) error {
	if err := backend.CheckID(id); err != nil {
		return err
	}
	done, err := s.enter()
	if err != nil {
		return err
	}
	defer done()
	trash := s.trashPath()
	if err := unix.Renameat(s.rootFd, id, s.rootFd, trash); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("layer %s: move to trash: %w", id, err)
	}
	if err := s.purge(ctx, trash); err != nil {
		return fmt.Errorf("layer %s: %w", id, err)
	}
	return nil
}

// purge deletes the trash entry rel (relative to the mount), clears the
// limits of its project and frees the project id.
func (s *Store) purge(ctx context.Context, rel string) error {
	fd, err := unix.Openat(s.rootFd, rel, dirFlags, 0)
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		if err := unix.Unlinkat(s.rootFd, rel, 0); err != nil {
			return fmt.Errorf("delete %s: %w", rel, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", rel, err)
	}
	projid, err := projectID(fd)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if err := removeTree(ctx, s.rootFd, rel); err != nil {
		return fmt.Errorf("delete %s: %w", rel, err)
	}
	// Limits left behind by a crash here are harmless: Create sets all of
	// them when it hands the id out again.
	if projid != 0 {
		if err := setLimits(s.rootFd, projid, 0, 0); err != nil {
			return err
		}
		s.ids.release(projid)
	}
	return nil
}

// Usage returns what the layer of sandbox id uses: bytes of blocks and
// inodes, the latter without the few the layout itself takes.
func (s *Store) Usage(id string) (bytes, inodes int64, err error) {
	if err := backend.CheckID(id); err != nil {
		return 0, 0, err
	}
	done, err := s.enter()
	if err != nil {
		return 0, 0, err
	}
	defer done()
	projid, err := s.projectOf(id)
	if err != nil {
		return 0, 0, err
	}
	bytes, inodes, err = usage(s.rootFd, projid)
	if err != nil {
		return 0, 0, fmt.Errorf("layer %s: %w", id, err)
	}
	return bytes, max(inodes-layoutInodes, 0), nil
}

// projectOf reads the project id of layer id from its directory.
func (s *Store) projectOf(id string) (uint32, error) {
	fd, err := unix.Openat(s.rootFd, id, dirFlags, 0)
	if errors.Is(err, unix.ENOENT) {
		return 0, errdefs.NotFound("layer %s: not found", id)
	}
	if err != nil {
		return 0, fmt.Errorf("layer %s: open: %w", id, err)
	}
	defer unix.Close(fd)
	projid, err := projectID(fd)
	if err != nil {
		return 0, fmt.Errorf("layer %s: %w", id, err)
	}
	return projid, nil
}

// Locate returns the host directory of sandbox id's upper layer.
func (s *Store) Locate(id string) (upper.Location, error) {
	if err := backend.CheckID(id); err != nil {
		return upper.Location{}, err
	}
	dir := filepath.Join(s.mnt, id, "upper")
	if _, err := os.Stat(dir); err != nil {
		return upper.Location{}, fmt.Errorf("layer %s: %w", id, err)
	}
	return upper.Location{Dir: dir, Scratch: filepath.Join(s.mnt, s.trashPath())}, nil
}
