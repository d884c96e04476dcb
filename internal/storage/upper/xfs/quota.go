// Package xfs is the writable-layer store (upper.Store) with disk quotas
// on XFS: one sparse XFS image (<dir>/uppers.img) loop-mounted with prjquota
// at <dir>/uppers, and in it one directory per sandbox with an overlayfs
// upper and work dir, charged to its own XFS project with hard block and
// inode limits. Everything the store knows it reads back from that
// filesystem (ids are directory names, project ids are on the directories),
// so there is no state file to drift and a daemon restart just reopens it.
//
// It must not import corral packages other than internal/storage/upper
// (the Layer type), internal/errdefs, internal/storage/upper/loopdev,
// internal/mountinfo and internal/backend (CheckID, the sandbox id rule).
package xfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/upper"
	"github.com/corral-dev/corral/internal/storage/upper/loopdev"
	"golang.org/x/sys/unix"
)

const (
	// DefaultSizeBytes is the image size when Config.SizeBytes is 0. The
	// image is sparse: it costs only what is written.
	DefaultSizeBytes = 64 << 30
	// MinSizeBytes is the smallest image mkfs.xfs accepts.
	MinSizeBytes = 300 << 20
	// MinBytes and MinInodes are the smallest limits Create accepts.
	MinBytes  = 1 << 20
	MinInodes = 16

	imageName = "uppers.img"
	mountName = "uppers"
	trashName = ".trash" // removed layers being deleted; ids cannot start with '.'
)

// layoutInodes are the inodes every layer spends before the sandbox writes
// anything: <id>, upper, work, and overlayfs's work/work (plus work/index
// with overlay's index=on, which corral does not use).
// Create adds them to the requested limit so that the sandbox gets what was
// asked for.
const layoutInodes = 4

// Config says where the store lives.
type Config struct {
	// Dir holds the image and its mount point. It must be on a local
	// filesystem; it is created if missing.
	Dir string
	// SizeBytes is the size of the sparse image when Open creates it
	// (0 = DefaultSizeBytes). An existing image keeps its size.
	SizeBytes int64
}

// Store hands out quota-limited writable layers. Its methods are safe for
// concurrent use; none may be called after Close.
type Store struct {
	mnt     string // <dir>/uppers
	loopDev string // /dev/loopN backing mnt
	rootFd  int    // open on mnt: the dir fd for *at calls and quotactl_fd

	life   sync.RWMutex // held shared by every operation, exclusively by Close
	closed bool

	ids projectIDs

	trashSeq atomic.Uint64
}

// Open mounts (or, after a daemon restart, reuses) the layer filesystem in
// cfg.Dir, formatting a new image first if there is none, and finishes any
// Remove a crash interrupted.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Dir == "" {
		return nil, errdefs.InvalidArgument("quota dir: must not be empty")
	}
	size := cfg.SizeBytes
	if size == 0 {
		size = DefaultSizeBytes
	}
	if size < MinSizeBytes {
		return nil, errdefs.InvalidArgument("quota image size: %d bytes is below the minimum of %d", size, int64(MinSizeBytes))
	}
	if err := probeKernel(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("quota dir: %w", err)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err == nil {
		dir, err = filepath.EvalSymlinks(dir) // mountinfo shows resolved paths
	}
	if err != nil {
		return nil, fmt.Errorf("quota dir %s: %w", cfg.Dir, err)
	}
	s := &Store{mnt: filepath.Join(dir, mountName), rootFd: -1}
	if err := os.MkdirAll(s.mnt, 0o700); err != nil {
		return nil, fmt.Errorf("quota mount point: %w", err)
	}
	if err := s.mount(ctx, filepath.Join(dir, imageName), size); err != nil {
		return nil, err
	}
	if err := s.load(ctx); err != nil {
		_ = s.Close(context.WithoutCancel(ctx), false)
		return nil, err
	}
	return s, nil
}

// mount reuses the filesystem at s.mnt or loop-mounts image there.
func (s *Store) mount(ctx context.Context, image string, size int64) error {
	m, err := findMount(s.mnt)
	if err != nil {
		return err
	}
	if m == nil {
		if _, err := os.Stat(image); errors.Is(err, os.ErrNotExist) {
			if err := makeImage(ctx, image, size); err != nil {
				return fmt.Errorf("quota image: %w", err)
			}
		} else if err != nil {
			return fmt.Errorf("quota image: %w", err)
		}
		devFile, err := loopdev.Attach(image, sectorSize)
		if err != nil {
			return fmt.Errorf("quota image %s: %w", image, err)
		}
		dev := devFile.Name()
		// Once mounted the mount holds the device; closing our fd (on
		// success or failure) lets autoclear detach it when that ends.
		err = unix.Mount(dev, s.mnt, "xfs", unix.MS_NOATIME, "prjquota,discard")
		if errors.Is(err, unix.EINVAL) && xfsWithoutQuota(dev, s.mnt) {
			err = errdefs.NotSupported("disk quota: XFS mounts without prjquota only: needs a kernel with XFS quota support (CONFIG_XFS_QUOTA)")
		}
		devFile.Close()
		if errors.Is(err, unix.ENODEV) {
			return errdefs.NotSupported("disk quota: needs the xfs filesystem in the kernel (CONFIG_XFS_FS)")
		}
		if err != nil {
			return fmt.Errorf("mount %s on %s: %w", dev, s.mnt, err)
		}
		if m, err = findMount(s.mnt); err != nil {
			return err
		}
		if m == nil {
			return fmt.Errorf("mount %s on %s: not in mountinfo after mounting", dev, s.mnt)
		}
	}
	if m.FSType != "xfs" || !strings.HasPrefix(m.Source, "/dev/loop") {
		return errdefs.FailedPrecondition("quota mount %s: is %s from %s, want xfs from a loop device", s.mnt, m.FSType, m.Source)
	}
	s.loopDev = m.Source
	if back := loopdev.BackingFile(m.Source); back != image {
		return errdefs.FailedPrecondition("quota mount %s: %s is backed by %q, want %q", s.mnt, m.Source, back, image)
	}
	if !m.HasSuperOption("prjquota") {
		return errdefs.FailedPrecondition("quota mount %s: mounted without enforced project quota (options %s); unmount it", s.mnt, strings.Join(m.SuperOptions, ","))
	}
	fd, err := unix.Open(s.mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", s.mnt, err)
	}
	s.rootFd = fd
	return nil
}

// load derives the project ids in use from the layer directories and
// finishes interrupted removals.
func (s *Store) load(ctx context.Context) error {
	if err := unix.Mkdirat(s.rootFd, trashName, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create %s: %w", trashName, err)
	}
	trash, err := os.ReadDir(filepath.Join(s.mnt, trashName))
	if err != nil {
		return fmt.Errorf("list %s: %w", trashName, err)
	}
	for _, e := range trash {
		if err := s.purge(ctx, filepath.Join(trashName, e.Name())); err != nil {
			return fmt.Errorf("finish removing a layer: %w", err)
		}
	}
	ids, err := s.IDs()
	if err != nil {
		return err
	}
	var live []uint32
	for _, id := range ids {
		projid, err := s.projectOf(id)
		if err != nil {
			return fmt.Errorf("layer %s: %w", id, err)
		}
		if projid == 0 { // a crash before Create set it; the node's sweep removes it
			continue
		}
		live = append(live, projid)
	}
	s.ids.reset(live)
	return nil
}

// IDs lists the ids of the layers in the store, including any that a crash
// left half-created.
func (s *Store) IDs() ([]string, error) {
	done, err := s.enter()
	if err != nil {
		return nil, err
	}
	defer done()
	ids, err := upper.DirIDs(s.mnt)
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	return ids, nil
}

// Close releases the store. With unmount it also unmounts the filesystem and
// waits for the loop device to detach (tests, `corral serve --cleanup`);
// without, the mount stays for the next Open (daemon restart).
func (s *Store) Close(ctx context.Context, unmount bool) error {
	s.life.Lock()
	defer s.life.Unlock()
	if !s.closed && s.rootFd >= 0 {
		unix.Close(s.rootFd)
	}
	s.closed, s.rootFd = true, -1
	if !unmount {
		return nil
	}
	m, err := findMount(s.mnt)
	if err != nil {
		return err
	}
	if m != nil {
		if err := unix.Unmount(s.mnt, 0); err != nil {
			if errors.Is(err, unix.EBUSY) {
				return errdefs.FailedPrecondition("unmount %s: busy (a process or mount still uses it)", s.mnt)
			}
			return fmt.Errorf("unmount %s: %w", s.mnt, err)
		}
	}
	if s.loopDev != "" {
		return loopdev.WaitDetached(ctx, s.loopDev, 2*time.Second)
	}
	return nil
}

func checkLimits(bytes, inodes int64) error {
	if bytes < MinBytes {
		return errdefs.InvalidArgument("disk: %d bytes is below the minimum of %d", bytes, int64(MinBytes))
	}
	if inodes < MinInodes {
		return errdefs.InvalidArgument("disk inodes: %d is below the minimum of %d", inodes, int64(MinInodes))
	}
	if inodes > 1<<62 || bytes > 1<<62 {
		return errdefs.InvalidArgument("disk: %d bytes / %d inodes is over the limit of %d", bytes, inodes, int64(1)<<62)
	}
	return nil
}

// enter starts an operation; call the returned func when it ends.
func (s *Store) enter() (func(), error) {
	s.life.RLock()
	if s.closed {
		s.life.RUnlock()
		return nil, errdefs.FailedPrecondition("quota store %s: closed", s.mnt)
	}
	return s.life.RUnlock, nil
}

// allocProject reserves the lowest project id that no layer has and
// nothing is charged to. The second check matters because XFS frees
// unlinked inodes in the background: just after a Remove its project may
// still show usage for a moment, and a process holding a deleted file open
// keeps it charged. Such ids cool off and are offered again later.
func (s *Store) allocProject() (uint32, error) {
	for range 1024 {
		p, ok := s.ids.take(time.Now())
		if !ok {
			return 0, errdefs.ResourceExhausted("quota store %s: every project id is in use", s.mnt)
		}
		bytes, inodes, err := usage(s.rootFd, p)
		if err != nil {
			s.ids.release(p)
			return 0, err
		}
		if bytes == 0 && inodes == 0 {
			return p, nil
		}
		s.ids.cool(p, time.Now())
	}
	return 0, errdefs.ResourceExhausted("quota store %s: 1024 project ids in a row still charged", s.mnt)
}

// trashPath names a fresh entry in the trash dir.
func (s *Store) trashPath() string {
	return filepath.Join(trashName, strconv.FormatUint(s.trashSeq.Add(1), 10))
}

// probeKernel refuses early, before any image is made, on a kernel whose
// XFS has no quota support: XFS registers /proc/fs/xfs/xqmstat only when it
// is built with CONFIG_XFS_QUOTA. (When XFS is not loaded yet the mount
// below finds out.)
func probeKernel() error {
	if _, err := os.Stat("/proc/fs/xfs/stat"); err != nil {
		return nil
	}
	if _, err := os.Stat("/proc/fs/xfs/xqmstat"); err != nil {
		return errdefs.NotSupported("disk quota: XFS without quota support: needs a kernel with CONFIG_XFS_QUOTA")
	}
	return nil
}
