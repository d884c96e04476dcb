package ext4img

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/upper"
	"github.com/corral-dev/corral/internal/storage/upper/loopdev"
	"golang.org/x/sys/unix"
)

var _ upper.Store = (*Store)(nil)

// detachWait is how long Remove waits for a loop device that still holds
// an image to detach: the last user of a mount may still be finishing.
const detachWait = 2 * time.Second

// Create makes the disk of sandbox id: <dir>/<id>.img, an empty ext4 with
// blocksBytes bytes and inodes inodes usable (hard limits: writes past them
// fail with ENOSPC), attached to a loop device with autoclear. The returned
// layer's Device keeps the device attached until whoever mounts it has done
// so; the caller must close it then (or on failure), after which the mount
// holds the device and its end detaches it. On error nothing of the disk
// remains.
func (s *Store) Create(ctx context.Context, id string, blocksBytes, inodes int64) (upper.Layer, error) {
	if err := backend.CheckID(id); err != nil {
		return upper.Layer{}, err
	}
	if err := checkLimits(blocksBytes, inodes); err != nil {
		return upper.Layer{}, err
	}
	if err := ctx.Err(); err != nil {
		return upper.Layer{}, fmt.Errorf("disk %s: %w", id, err)
	}
	tmpl, err := s.template(ctx, class{blocksBytes, inodes})
	if err != nil {
		return upper.Layer{}, fmt.Errorf("disk %s: %w", id, err)
	}
	img := s.imagePath(id)
	if err := s.place(tmpl, img); err != nil {
		return upper.Layer{}, fmt.Errorf("disk %s: %w", id, err)
	}
	dev, err := loopdev.Attach(img, blockSize)
	if err != nil {
		os.Remove(img)
		return upper.Layer{}, fmt.Errorf("disk %s: %w", id, err)
	}
	s.mu.Lock()
	s.devices[id] = dev.Name()
	s.mu.Unlock()
	return upper.Layer{Device: dev, DevicePath: dev.Name()}, nil
}

// place copies the template to img through <img>.tmp, so that an image
// under its final name is always complete; an existing img is never
// replaced.
func (s *Store) place(tmpl, img string) error {
	tmp := img + tmpExt
	if err := s.copySparse(tmpl, tmp); err != nil {
		if errors.Is(err, os.ErrExist) {
			return errdefs.AlreadyExists("being created")
		}
		return fmt.Errorf("copy template: %w", err)
	}
	err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, img, unix.RENAME_NOREPLACE)
	if err != nil {
		os.Remove(tmp)
		if errors.Is(err, unix.EEXIST) {
			return errdefs.AlreadyExists("already exists")
		}
		return fmt.Errorf("rename copy into place: %w", err)
	}
	return nil
}

// Remove deletes the disk of sandbox id; it is a no-op for an id that has
// none. The loop device detaches by itself once the sandbox's mount
// namespace is gone; while a loop device still holds the image (the
// sandbox, or something in its mount, is still alive) Remove waits briefly,
// then fails with FailedPrecondition rather than delete the image under it.
func (s *Store) Remove(ctx context.Context, id string) error {
	if err := backend.CheckID(id); err != nil {
		return err
	}
	img := s.imagePath(id)
	if err := os.Remove(img + tmpExt); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("disk %s: %w", id, err)
	}
	if _, err := os.Lstat(img); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	s.mu.Lock()
	dev, known := s.devices[id]
	s.mu.Unlock()
	if err := waitUnheld(ctx, img, dev, known); err != nil {
		return fmt.Errorf("disk %s: %w", id, err)
	}
	if err := os.Remove(img); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("disk %s: %w", id, err)
	}
	s.mu.Lock()
	delete(s.devices, id)
	s.mu.Unlock()
	return nil
}

// waitUnheld waits up to detachWait (or ctx) until no loop device holds img.
// When this store attached img (known), only that device can hold it.
func waitUnheld(ctx context.Context, img, dev string, known bool) error {
	deadline := time.Now().Add(detachWait)
	for {
		holders, err := holdersOf(img, dev, known)
		if err != nil || len(holders) == 0 {
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errdefs.FailedPrecondition("image still attached to %s after %v: "+
				"its sandbox (or a process in its mount namespace) is still alive", strings.Join(holders, ", "), detachWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func holdersOf(img, dev string, known bool) ([]string, error) {
	if !known {
		return loopdev.Holders(img)
	}
	back := loopdev.BackingFile(dev)
	if back == img || back == img+" (deleted)" {
		return []string{dev}, nil
	}
	return nil, nil
}

// Locate returns the disk image of sandbox id (its filesystem holds the
// upper directory as upper/).
func (s *Store) Locate(id string) (upper.Location, error) {
	if err := backend.CheckID(id); err != nil {
		return upper.Location{}, err
	}
	img := s.imagePath(id)
	if _, err := os.Stat(img); err != nil {
		return upper.Location{}, fmt.Errorf("disk %s: %w", id, err)
	}
	return upper.Location{Image: img}, nil
}

// Close is a no-op: the store holds nothing open (each layer's loop device
// goes with the mount that holds it).
func (s *Store) Close(context.Context, bool) error { return nil }
