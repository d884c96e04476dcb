// Package lazy serves layer data blobs as read-only files on a FUSE
// mount, fetching each fixed-size chunk from a blob.Store the first time it
// is read. The kernel mounts a layer's EROFS metadata with such a file as
// its blob device (mount -t erofs -o ro,device=<file> meta.erofs dir), so a
// sandbox starts with only the metadata local and reads pull in just the
// chunks they touch.
//
// Chunks are checked against the blob's manifest (sha256 per chunk) before
// they are stored or served, fetched once however many readers wait
// (singleflight), and kept in a node-wide cache: one sparse file per blob
// with a persistent bitmap of the chunks present, shared by every sandbox,
// surviving restarts, bounded by a size limit with least-recently-used
// eviction by watermark (evicted chunks become holes: FALLOC_FL_PUNCH_HOLE).
// A fetch that does not finish within Config.FetchTimeout fails the read
// with EIO and reports the fault (Config.OnFault), so the node can mark the
// sandboxes using the layer degraded while it serves the others.
//
// The FUSE server runs in goroutines of the process that calls New. That
// process may read through the mounts it backs (the Go runtime serves FUSE
// on other threads), but it must never fork/exec a binary that lives on
// them: Go's vfork keeps the forking thread's scheduler slot until the
// child's exec is done, the exec waits for a FUSE read, and a fetch that
// triggers a garbage collection waits for that slot — a deadlock that also
// leaves the child holding /dev/fuse. Exec a host binary (chroot, init)
// that then execs from the mount. A node therefore runs the FS in a server
// process of its own (Serve, started by Start as `corral lazyblob-serve`)
// and drives it through a Client over a unix socket; the mount then also
// outlives a daemon restart. It imports blob and errdefs only.
package lazy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/blob"
)

// Config configures an FS. Zero fields take the defaults.
type Config struct {
	// Mountpoint is where the FUSE filesystem is mounted (created).
	Mountpoint string `json:"mountpoint"`
	// CacheDir holds the chunk cache; one FS uses it at a time.
	CacheDir string `json:"cache_dir"`
	// CacheLimit bounds the bytes of chunks kept (0: no limit). Past
	// HighWatermark×limit the least recently used chunks are evicted down
	// to LowWatermark×limit (defaults 0.95 and 0.80).
	CacheLimit    int64   `json:"cache_limit,omitempty"`
	HighWatermark float64 `json:"high_watermark,omitempty"`
	LowWatermark  float64 `json:"low_watermark,omitempty"`
	// FetchTimeout bounds one chunk fetch, retries included (default 30s):
	// past it the read fails with EIO.
	FetchTimeout time.Duration `json:"fetch_timeout,omitempty"`
	// Attempts is how often a chunk whose digest does not match is fetched
	// before the read fails (default 3).
	Attempts int `json:"attempts,omitempty"`
	// OnFault is called (from a fetching goroutine; it must not block
	// long) when a chunk of digest could not be fetched: the reader got
	// EIO. The node marks the sandboxes using that layer degraded.
	OnFault func(digest string, err error) `json:"-"`
	// Attribute names the group (the node: the sandbox) of the process
	// with pid that reads a lazy file, for GroupStats; "" or a nil
	// Attribute leaves the read unattributed. It is called at most once a
	// second per pid and must be quick.
	Attribute func(pid uint32) string `json:"-"`
	// FlushInterval is how often new chunks' bitmap bits are made
	// durable (default 1s; the data is synced first).
	FlushInterval time.Duration `json:"flush_interval,omitempty"`
	Log           *slog.Logger  `json:"-"`
}

func (c *Config) defaults() error {
	if c.Mountpoint == "" {
		return errdefs.InvalidArgument("mountpoint: empty")
	}
	if c.CacheDir == "" {
		return errdefs.InvalidArgument("cache_dir: empty")
	}
	if c.CacheLimit < 0 {
		return errdefs.InvalidArgument("cache_limit: %d is negative", c.CacheLimit)
	}
	if c.HighWatermark == 0 {
		c.HighWatermark = 0.95
	}
	if c.LowWatermark == 0 {
		c.LowWatermark = 0.80
	}
	if !(0 < c.LowWatermark && c.LowWatermark < c.HighWatermark && c.HighWatermark <= 1) {
		return errdefs.InvalidArgument("watermarks: want 0 < low (%g) < high (%g) <= 1", c.LowWatermark, c.HighWatermark)
	}
	if c.FetchTimeout == 0 {
		c.FetchTimeout = 30 * time.Second
	}
	if c.FetchTimeout < 0 {
		return errdefs.InvalidArgument("fetch_timeout: %v is negative", c.FetchTimeout)
	}
	if c.Attempts <= 0 {
		c.Attempts = 3
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// FS is a node's lazy blob filesystem: one file per registered blob.
type FS struct {
	cfg   Config
	store blob.Store

	ctx    context.Context // ends at Close: cancels fetches and prefetches
	cancel context.CancelFunc
	lock   *os.File // flock on the cache dir
	root   *rootNode
	server *fuse.Server

	mu    sync.Mutex
	blobs map[string]*blobFile // by digest

	groups groups
	faults faultLog

	used       atomic.Int64 // bytes of chunks present, over all blobs
	foreground atomic.Int64 // reader fetches in flight (prefetch yields to them)
	evictMu    sync.Mutex
	evicting   atomic.Bool

	flushDone chan struct{}
	closeOnce sync.Once
}

// New opens the cache in cfg.CacheDir and mounts the filesystem at
// cfg.Mountpoint. Close unmounts it.
func New(ctx context.Context, cfg Config, store blob.Store) (*FS, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.CacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("lazy blob cache %s: %w", cfg.CacheDir, err)
	}
	lock, err := os.OpenFile(filepath.Join(cfg.CacheDir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lazy blob cache: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, errdefs.FailedPrecondition("lazy blob cache %s is in use by another process: %v", cfg.CacheDir, err)
	}
	// Holding the cache lock, no live server owns the mountpoint: a mount
	// there is a dead server's (ENOTCONN to every reader) and goes.
	if err := unix.Unmount(cfg.Mountpoint, unix.MNT_DETACH); err == nil {
		cfg.Log.Warn("lazy blob: detached a dead server's mount", "mountpoint", cfg.Mountpoint)
	}
	if err := os.MkdirAll(cfg.Mountpoint, 0o755); err != nil {
		lock.Close()
		return nil, fmt.Errorf("lazy blob mountpoint: %w", err)
	}
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f := &FS{
		cfg: cfg, store: store, ctx: fctx, cancel: cancel, lock: lock,
		root: &rootNode{}, blobs: map[string]*blobFile{}, flushDone: make(chan struct{}),
		groups: groups{attribute: cfg.Attribute, byPid: map[uint32]pidGroup{}, counters: map[string]*groupCounters{}},
	}
	zero := time.Duration(0)
	attr := time.Hour // blob files never change
	server, err := fs.Mount(cfg.Mountpoint, f.root, &fs.Options{
		MountOptions: fuse.MountOptions{
			DirectMount:       true, // as root: no fusermount helper needed
			DirectMountStrict: true, // and a clear error instead of looking for one
			AllowOther:        true, // sandboxes' uids read through EROFS
			FsName:            "corral-lazyblob",
			Name:              "corral",
			MaxWrite:          1 << 20, // largest read request: 1 MiB
			// Replies come from memory; splicing them only logs that a 1 MiB
			// reply plus its header outgrows the pipe.
			DisableSplice: true,
			// No passthrough (reads are served from the cache here): a FUSE
			// mount that negotiates it is a stacked file system (its
			// s_stack_depth is the passthrough depth), and kernels with
			// erofs's stacking limit (6.19, backported to 6.18.y) refuse
			// file-backed EROFS mounts of blobs on it.
			DisabledCapabilities: fuse.CAP_PASSTHROUGH,
			Options:              []string{"ro", "default_permissions"},
		},
		EntryTimeout:    &attr,
		AttrTimeout:     &attr,
		NegativeTimeout: &zero, // blobs appear while mounted
	})
	if err != nil {
		cancel()
		lock.Close()
		return nil, fmt.Errorf("mount lazy blob fs at %s: %w", cfg.Mountpoint, err)
	}
	f.server = server
	go f.flushLoop()
	return f, nil
}

// Path returns the file of blob digest on the mount.
func (f *FS) Path(digest string) string {
	return filepath.Join(f.cfg.Mountpoint, fileName(digest))
}

func fileName(digest string) string { return strings.Replace(digest, ":", "-", 1) }

// Register makes blob digest of size bytes available as a file and returns
// its path, ready to be an EROFS blob device. Its manifest comes from the
// cache or else from the store. Registering again returns the same path.
func (f *FS) Register(ctx context.Context, digest string, size int64) (string, error) {
	if err := blob.CheckKey(digest); err != nil || strings.Contains(digest, ".") {
		return "", errdefs.InvalidArgument("digest: %q must be sha256:<64 hex>", digest)
	}
	if size <= 0 {
		return "", errdefs.InvalidArgument("size: %d must be positive", size)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if b, ok := f.blobs[digest]; ok {
		if b.m.Size != size {
			return "", errdefs.InvalidArgument("size: blob %s is registered with %d bytes, not %d", digest, b.m.Size, size)
		}
		return f.Path(digest), nil
	}
	if f.ctx.Err() != nil {
		return "", errdefs.FailedPrecondition("lazy blob fs is closed")
	}
	// Bounded: Register holds f.mu, which Stats also takes.
	octx, cancel := context.WithTimeout(ctx, f.cfg.FetchTimeout)
	defer cancel()
	b, err := openBlob(octx, f, digest, size)
	if err != nil {
		return "", fmt.Errorf("register blob %s: %w", digest, err)
	}
	f.used.Add(b.presentBytes())
	node := f.root.NewPersistentInode(ctx, &fileNode{b: b}, fs.StableAttr{Mode: syscall.S_IFREG})
	f.root.AddChild(fileName(digest), node, false)
	f.blobs[digest] = b
	f.maybeEvict()
	return f.Path(digest), nil
}

func (f *FS) blob(digest string) (*blobFile, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.blobs[digest]
	if !ok {
		return nil, errdefs.NotFound("blob %s is not registered", digest)
	}
	return b, nil
}

func (f *FS) all() []*blobFile {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Values(f.blobs))
}

// flushLoop makes new chunks durable every FlushInterval.
func (f *FS) flushLoop() {
	defer close(f.flushDone)
	t := time.NewTicker(f.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-f.ctx.Done():
			return
		case <-t.C:
			for _, b := range f.all() {
				if err := b.flush(false); err != nil {
					f.cfg.Log.Warn("lazy blob: flush cache", "blob", b.digest, "err", err)
				}
			}
		}
	}
}

// Close unmounts the filesystem and flushes the cache. EROFS mounts using
// its files must be gone first (else errdefs.FailedPrecondition and the
// filesystem stays mounted and served).
func (f *FS) Close() error {
	// Unmounted here, not by server.Unmount: that retries a busy mount for
	// seconds and then looks for fusermount. The serve loop ends when the
	// kernel drops the connection.
	err := unix.Unmount(f.cfg.Mountpoint, 0)
	// The kernel lets go of an unmounted layer's blob file a moment after
	// the layer's umount returns: a busy mount gets a short grace.
	for deadline := time.Now().Add(2 * time.Second); errors.Is(err, unix.EBUSY) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		err = unix.Unmount(f.cfg.Mountpoint, 0)
	}
	if err != nil && !(errors.Is(err, unix.EINVAL) && f.ctx.Err() != nil) {
		if errors.Is(err, unix.EBUSY) {
			return errdefs.FailedPrecondition("unmount lazy blob fs %s: busy (unmount the layers using it first)", f.cfg.Mountpoint)
		}
		return fmt.Errorf("unmount lazy blob fs %s: %w", f.cfg.Mountpoint, err)
	}
	var errs []error
	f.closeOnce.Do(func() {
		f.server.Wait()
		f.cancel()
		<-f.flushDone
		for _, b := range f.all() {
			errs = append(errs, b.flush(false), b.close())
		}
		errs = append(errs, f.lock.Close())
	})
	return errors.Join(errs...)
}

// rootNode is the mount's directory of blob files, root's only.
type rootNode struct{ fs.Inode }

var _ fs.NodeGetattrer = (*rootNode)(nil)

func (r *rootNode) Getattr(ctx context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o700
	out.Nlink = 2
	return 0
}
