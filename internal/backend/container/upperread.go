package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/runtime/osthread"
	"github.com/corral-dev/corral/internal/storage/upper"
	"github.com/corral-dev/corral/internal/storage/upper/loopdev"
)

var _ backend.UpperSnapshotter = (*Backend)(nil)

// diskBlockSize is the loop device block size for a sandbox's disk image
// (ext4's block size, as internal/storage/upper/ext4img attaches it).
const diskBlockSize = 4096

// SnapshotUpper implements backend.UpperSnapshotter: cp -a (reflinks
// where the filesystem can, holes kept, overlay xattrs and whiteouts as
// they are) of the upper directory into the store's scratch path on the
// same filesystem (a pool's: reflinks make the copy cost metadata only),
// or else into the sandbox's run directory (removed with the sandbox, a
// leftover of a crash by the next snapshot).
func (b *Backend) SnapshotUpper(ctx context.Context, id string) (string, func() error, error) {
	if err := backend.CheckID(id); err != nil {
		return "", nil, err
	}
	loc, err := b.cfg.Uppers.Locate(id)
	if err != nil {
		return "", nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	dst := loc.Scratch
	if dst == "" {
		dst = filepath.Join(b.runDir(id), "pack-snapshot")
	}
	if err := os.RemoveAll(dst); err != nil {
		return "", nil, fmt.Errorf("sandbox %s: snapshot: %w", id, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return "", nil, fmt.Errorf("sandbox %s: snapshot: %w", id, err)
	}
	remove := func() error { return os.RemoveAll(dst) }
	err = b.readUpper(ctx, id, loc, func(upper string) error {
		out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", "--", upper, dst).CombinedOutput()
		if err != nil {
			return fmt.Errorf("copy the writable layer: %w: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	})
	if err != nil {
		return "", nil, errors.Join(fmt.Errorf("sandbox %s: snapshot: %w", id, err), remove())
	}
	return dst, remove, nil
}

// readUpper calls fn with a read-only view of the upper directory at loc:
// fn runs on a locked OS thread and must not hand the path to other
// goroutines (the view may exist in that thread's mount namespace only);
// programs it starts see it. A host upper directory is
// handed over as it is. A disk image's filesystem is mounted only in the
// mount namespace of a throwaway OS thread, never on the host: the running
// sandbox's own loop device when it has one (the same superblock, so the
// view is its page cache, not stale blocks), else a new read-only attach
// of the image. When fn returns, or the daemon dies, the thread and its
// namespace go, taking the mount (and a new loop device) with them.
func (b *Backend) readUpper(ctx context.Context, id string, loc upper.Location, fn func(upper string) error) error {
	if loc.Dir != "" {
		return osthread.Run(func() error { return fn(loc.Dir) })
	}
	return osthread.Run(func() error { return b.readDisk(ctx, id, loc.Image, fn) })
}

// readDisk mounts the disk image img read-only in a private mount
// namespace of the current (locked) thread and calls fn with its upper/.
func (b *Backend) readDisk(ctx context.Context, id, img string, fn func(string) error) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("sandbox %s: read disk: unshare mount namespace: %w", id, err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("sandbox %s: read disk: make / rprivate: %w", id, err)
	}
	// The sandbox's disk mount point on the host: empty there, and only
	// this namespace sees the mount.
	mp := filepath.Join(b.runDir(id), "disk")
	if err := os.MkdirAll(mp, 0o700); err != nil {
		return fmt.Errorf("sandbox %s: read disk: %w", id, err)
	}
	if err := mountDisk(ctx, img, mp); err != nil {
		return fmt.Errorf("sandbox %s: read disk: %w", id, err)
	}
	defer unix.Unmount(mp, unix.MNT_DETACH)
	return fn(filepath.Join(mp, "upper"))
}

// mountDisk mounts img's ext4 filesystem read-only on mp.
func mountDisk(ctx context.Context, img, mp string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	holders, err := loopdev.Holders(img)
	if err != nil {
		return err
	}
	if len(holders) > 0 {
		// The sandbox's filesystem is mounted read-write: a read-only
		// mount of it would be refused (it would change the superblock's
		// state), so mount it as it is and make this mount read-only.
		if err := unix.Mount(holders[0], mp, "ext4", flags, ""); err != nil {
			return fmt.Errorf("mount %s: %w", holders[0], err)
		}
		if err := unix.Mount("", mp, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|flags, ""); err != nil {
			return errors.Join(fmt.Errorf("make %s read-only: %w", mp, err), unix.Unmount(mp, unix.MNT_DETACH))
		}
		return nil
	}
	dev, err := loopdev.Attach(img, diskBlockSize)
	if err != nil {
		return err
	}
	defer dev.Close() // autoclear: the mount keeps the device until it goes
	if err := unix.Mount(dev.Name(), mp, "ext4", flags|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mount %s (%s): %w", dev.Name(), img, err)
	}
	return nil
}
