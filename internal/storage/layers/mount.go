package layers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/mountinfo"
)

// Layers are mounted read-only, file-backed (the kernel reads the EROFS
// image file itself: no loop device), once per node at
// layers/sha256-<hex>/, and shared by every sandbox that uses them. The
// layers directory is a private bind mount of itself, so that mounting a
// layer never propagates into the copies of the mount table that sandbox
// mount namespaces hold.

const layerMountFlags = unix.MS_RDONLY | unix.MS_NODEV | unix.MS_NOSUID

// mountsUnder returns the mount points under dir (dir itself included).
func mountsUnder(dir string) (map[string]bool, error) {
	mounts, err := mountinfo.Read()
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, m := range mounts {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
			out[m.MountPoint] = true
		}
	}
	return out, nil
}

// isMountPoint says whether dir is the root of a mount. Every create asks
// (Acquire of its layers), so it is one statx rather than a read of
// mountinfo, which grows with the node's mounts; kernels that cannot tell
// (before 5.8) get the read.
func isMountPoint(dir string) (bool, error) {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE, &stx)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("statx %s: %w", dir, err)
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
	}
	mounted, err := mountsUnder(dir)
	return mounted[dir], err
}

// privatize makes the layers directory a private mount of its own.
func (s *Store) privatize(mounted map[string]bool) error {
	if !mounted[s.layers] {
		if err := unix.Mount(s.layers, s.layers, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("layer store: bind %s: %w", s.layers, err)
		}
	}
	if err := unix.Mount("", s.layers, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("layer store: make %s private: %w", s.layers, err)
	}
	return nil
}

// reconcile runs at Open: mount directories left by an earlier run are
// mounted again when their layer is missing from the mount table (after a
// reboot), and mounts whose layer is gone are removed.
func (s *Store) reconcile(ctx context.Context) error {
	mounted, err := mountsUnder(s.layers)
	if err != nil {
		return fmt.Errorf("layer store: %w", err)
	}
	if err := s.privatize(mounted); err != nil {
		return err
	}
	idx, err := s.readIndex()
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(s.layers)
	if err != nil {
		return fmt.Errorf("layer store: %w", err)
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || !strings.HasPrefix(name, digestAlgo+"-") {
			continue
		}
		mp := filepath.Join(s.layers, name)
		digest, _, ok := splitMountDir(name)
		var statErr error
		if ok {
			_, statErr = os.Stat(s.metaFile(digest))
		}
		switch {
		case !ok || errors.Is(statErr, os.ErrNotExist):
			if mounted[mp] {
				errs = append(errs, unmount(mp))
			}
			errs = append(errs, removeDir(mp))
		case !mounted[mp]:
			_, err := s.mountLayerAt(ctx, idx.describe("", digest), mp)
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("layer store: %w", err)
	}
	return nil
}

// mountLayer mounts l at its mount point unless it is there: the metadata
// file with the blob from the BlobSource as its extra device. It returns
// the layer as the files a VM attaches.
func (s *Store) mountLayer(ctx context.Context, l Layer) (backend.LayerDisk, error) {
	return s.mountLayerAt(ctx, l, s.layerMount(l.Digest))
}

// mountLayerAt is mountLayer at the mount point mp (a scoped one).
func (s *Store) mountLayerAt(ctx context.Context, l Layer, mp string) (backend.LayerDisk, error) {
	disk := backend.LayerDisk{Image: s.metaFile(l.Digest)}
	opts := ""
	if l.Split() {
		blob, err := s.blobSrc.BlobPath(ctx, l)
		if err != nil {
			return disk, fmt.Errorf("mount layer %s: %w", l.Digest, err)
		}
		if strings.ContainsAny(blob, ",") {
			return disk, fmt.Errorf("mount layer %s: blob path %q has a comma, which mount options cannot carry", l.Digest, blob)
		}
		opts = "device=" + blob
		disk.Devices = []string{blob}
	}
	s.mountMu.Lock()
	defer s.mountMu.Unlock()
	mounted, err := isMountPoint(mp)
	if err != nil {
		return disk, err
	}
	if mounted {
		return disk, nil
	}
	if err := os.Mkdir(mp, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return disk, fmt.Errorf("mount layer %s: %w", l.Digest, err)
	}
	if err := unix.Mount(s.metaFile(l.Digest), mp, "erofs", layerMountFlags, opts); err != nil {
		return disk, fmt.Errorf("mount layer %s: %w", l.Digest, err)
	}
	// Under mountMu: a create of this image waits for the warm rather
	// than reading the files first (and being charged for them).
	if !s.lazilyRead(ctx, l) {
		if err := warmLayer(ctx, mp, s.warmBudget); err != nil {
			return disk, fmt.Errorf("mount layer %s: read into the page cache: %w", l.Digest, err)
		}
	}
	return disk, nil
}

// unmountLayer detaches digest's mounts (shared and scoped) and removes
// their mount points.
func (s *Store) unmountLayer(digest string) error {
	s.mountMu.Lock()
	defer s.mountMu.Unlock()
	scoped, err := s.scopedMounts(digest)
	errs := []error{err}
	for _, mp := range append(scoped, s.layerMount(digest)) {
		errs = append(errs, unmount(mp), removeDir(mp))
	}
	return errors.Join(errs...)
}

// unmount detaches the mount at mp, lazily when it is busy (a sandbox
// overlay keeps its own reference to the layer).
func unmount(mp string) error {
	err := unix.Unmount(mp, 0)
	if err == unix.EBUSY {
		err = unix.Unmount(mp, unix.MNT_DETACH)
	}
	if err != nil && err != unix.EINVAL && err != unix.ENOENT { // not mounted, no mount point
		return fmt.Errorf("unmount %s: %w", mp, err)
	}
	return nil
}

// Close releases the store. With unmount, every layer mount and the
// private bind of the layers directory go too; without, they stay for the
// next Open (sandboxes keep running across daemon restarts).
func (s *Store) Close(unmountAll bool) error {
	if !unmountAll {
		return nil
	}
	s.mountMu.Lock()
	defer s.mountMu.Unlock()
	mounted, err := mountsUnder(s.layers)
	if err != nil {
		return fmt.Errorf("layer store: %w", err)
	}
	var errs []error
	for mp := range mounted {
		if mp != s.layers {
			errs = append(errs, unmount(mp), removeDir(mp))
		}
	}
	if mounted[s.layers] {
		errs = append(errs, unmount(s.layers))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("layer store: close: %w", err)
	}
	return nil
}

// removeDir removes an empty mount point directory, if it is there.
func removeDir(dir string) error {
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
