package lazy

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/storage/blob"
)

// A blob's cache is four files in the cache dir, named by its hex digest:
//
//	<hex>.data    sparse, the blob's size; chunks present are written in place
//	<hex>.bitmap  one bit per chunk: set when the chunk in .data is valid
//	<hex>.atime   uint32 seconds per chunk: last use, for LRU across restarts
//	<hex>.chunks  the manifest, so a restart needs no store to serve the cache
//
// Ordering keeps the bitmap honest after a crash: data is synced before a
// set bit is written, and a cleared bit is synced before its chunk's hole
// is punched.

type blobFile struct {
	fs     *FS
	digest string
	m      *blob.Manifest
	base   string // cache path without extension

	mu     sync.RWMutex // RLock: read a present chunk; Lock: change presence
	data   *os.File
	bitmap *os.File
	bits   []byte
	dirty  bool

	lastUse []atomic.Uint32 // unix seconds; 0 = never
	group   singleflight.Group

	fetchedBytes, hits, misses, corrupt, faults, prefetched atomic.Int64
	fault                                                   atomic.Pointer[Fault]
	rec                                                     atomic.Pointer[recorder]
}

// Fault is the last failed fetch of a blob.
type Fault struct {
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

func openBlob(ctx context.Context, f *FS, digest string, size int64) (*blobFile, error) {
	b := &blobFile{fs: f, digest: digest, base: filepath.Join(f.cfg.CacheDir, strings.TrimPrefix(digest, "sha256:"))}
	m, fresh, err := b.loadManifest(ctx, size)
	if err != nil {
		return nil, err
	}
	b.m = m
	n := m.NumChunks()
	b.lastUse = make([]atomic.Uint32, n)
	if fresh { // a new or changed manifest: old cache contents mean nothing
		for _, ext := range []string{".data", ".bitmap", ".atime"} {
			if err := os.Remove(b.base + ext); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, err
			}
		}
	}
	if b.data, err = os.OpenFile(b.base+".data", os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		return nil, err
	}
	if err := b.data.Truncate(m.Size); err != nil {
		b.data.Close()
		return nil, err
	}
	if b.bitmap, err = os.OpenFile(b.base+".bitmap", os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		b.data.Close()
		return nil, err
	}
	b.bits = make([]byte, (n+7)/8)
	if got, err := b.bitmap.ReadAt(b.bits, 0); err != nil && got != len(b.bits) {
		clear(b.bits) // short or missing bitmap: nothing is known present
	}
	if atimes, err := os.ReadFile(b.base + ".atime"); err == nil && len(atimes) == 4*n {
		for i := range n {
			b.lastUse[i].Store(binary.LittleEndian.Uint32(atimes[4*i:]))
		}
	}
	return b, nil
}

// loadManifest returns the cached manifest when it describes this blob,
// else the store's (cached for next time; fresh reports that case).
func (b *blobFile) loadManifest(ctx context.Context, size int64) (*blob.Manifest, bool, error) {
	var cached blob.Manifest
	raw, err := os.ReadFile(b.base + ".chunks")
	cachedOK := err == nil && json.Unmarshal(raw, &cached) == nil && cached.Blob == b.digest && cached.Size == size
	m, err := blob.FetchManifest(ctx, b.fs.store, b.digest, size)
	if err != nil {
		if cachedOK { // the store is down: the cache still serves what it has
			b.fs.cfg.Log.Warn("lazy blob: manifest from cache", "blob", b.digest, "err", err)
			return &cached, false, nil
		}
		return nil, false, err
	}
	if cachedOK && reflect.DeepEqual(&cached, m) {
		return m, false, nil
	}
	out, err := json.Marshal(m)
	if err == nil {
		err = os.WriteFile(b.base+".chunks", out, 0o600)
	}
	return m, true, err
}

func (b *blobFile) has(i int) bool { return b.bits[i/8]&(1<<(i%8)) != 0 }

func (b *blobFile) presentBytes() int64 {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var n int64
	for i := range b.m.NumChunks() {
		if b.has(i) {
			_, l := b.m.ChunkRange(i)
			n += l
		}
	}
	return n
}

func (b *blobFile) touch(i int) {
	b.lastUse[i].Store(uint32(time.Now().Unix()))
	if r := b.rec.Load(); r != nil {
		r.add(i)
	}
}

// store writes a verified chunk into the cache and marks it present.
func (b *blobFile) store(i int, data []byte) error {
	off, _ := b.m.ChunkRange(i)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.has(i) {
		return nil
	}
	if _, err := b.data.WriteAt(data, off); err != nil {
		return fmt.Errorf("cache chunk %d: %w", i, err)
	}
	b.bits[i/8] |= 1 << (i % 8)
	b.lastUse[i].Store(uint32(time.Now().Unix())) // a prefetched chunk is new, not old
	b.dirty = true
	b.fs.used.Add(int64(len(data)))
	return nil
}

// flush makes the bitmap durable: data first, then bits (and, with
// syncBits, the bitmap itself, before holes are punched).
func (b *blobFile) flush(syncBits bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flushLocked(syncBits)
}

func (b *blobFile) flushLocked(syncBits bool) error {
	if !b.dirty {
		return nil
	}
	if err := b.data.Sync(); err != nil {
		return err
	}
	if _, err := b.bitmap.WriteAt(b.bits, 0); err != nil {
		return err
	}
	if syncBits {
		if err := b.bitmap.Sync(); err != nil {
			return err
		}
	}
	atimes := make([]byte, 4*len(b.lastUse))
	for i := range b.lastUse {
		binary.LittleEndian.PutUint32(atimes[4*i:], b.lastUse[i].Load())
	}
	if err := os.WriteFile(b.base+".atime", atimes, 0o600); err != nil {
		return err
	}
	b.dirty = false
	return nil
}

// evict drops chunks: clears their bits durably, then punches their holes.
func (b *blobFile) evict(chunks []int) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var freed int64
	var gone []int
	for _, i := range chunks {
		if b.has(i) {
			b.bits[i/8] &^= 1 << (i % 8)
			gone = append(gone, i)
		}
	}
	if len(gone) == 0 {
		return 0, nil
	}
	b.dirty = true
	if err := b.flushLocked(true); err != nil {
		return 0, fmt.Errorf("evict from blob %s: %w", b.digest, err)
	}
	for _, i := range gone {
		off, n := b.m.ChunkRange(i)
		if err := unix.Fallocate(int(b.data.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
			return freed, fmt.Errorf("evict blob %s chunk %d: punch hole: %w", b.digest, i, err)
		}
		freed += n
	}
	b.fs.used.Add(-freed)
	return freed, nil
}

func (b *blobFile) close() error {
	return errors.Join(b.data.Close(), b.bitmap.Close())
}

// maybeEvict starts an eviction when the cache is past its high watermark.
func (f *FS) maybeEvict() {
	limit := f.cfg.CacheLimit
	if limit == 0 || float64(f.used.Load()) <= f.cfg.HighWatermark*float64(limit) {
		return
	}
	if !f.evicting.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer f.evicting.Store(false)
		if err := f.evictTo(int64(f.cfg.LowWatermark * float64(limit))); err != nil {
			f.cfg.Log.Warn("lazy blob: evict", "err", err)
		}
	}()
}

// evictTo drops the least recently used chunks over all blobs until the
// cache holds at most target bytes.
func (f *FS) evictTo(target int64) error {
	f.evictMu.Lock()
	defer f.evictMu.Unlock()
	type cand struct {
		b    *blobFile
		i    int
		used uint32
		n    int64
	}
	var cands []cand
	for _, b := range f.all() {
		b.mu.RLock()
		for i := range b.m.NumChunks() {
			if b.has(i) {
				_, n := b.m.ChunkRange(i)
				cands = append(cands, cand{b, i, b.lastUse[i].Load(), n})
			}
		}
		b.mu.RUnlock()
	}
	sort.SliceStable(cands, func(x, y int) bool { return cands[x].used < cands[y].used })
	pick := map[*blobFile][]int{}
	over := f.used.Load() - target
	for _, c := range cands {
		if over <= 0 {
			break
		}
		pick[c.b] = append(pick[c.b], c.i)
		over -= c.n
	}
	var errs []error
	for b, chunks := range pick {
		_, err := b.evict(chunks)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
