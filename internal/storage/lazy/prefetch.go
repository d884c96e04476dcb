package lazy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/storage/blob"
)

// A hint is the chunks earlier starts of a blob's sandboxes read, in the
// order they were first read, kept in <hex>.hint. Replaying it as a
// prefetch warms the cache for the next start before it asks.

type recorder struct {
	mu    sync.Mutex
	users int
	seen  map[int]bool
	order []int
}

func (r *recorder) add(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.seen[i] {
		r.seen[i] = true
		r.order = append(r.order, i)
	}
}

// Record starts recording the chunks of blob digest that reads touch (all
// readers: overlapping starts share one recording). stop ends this caller's
// part; the last stop merges the chunks into the blob's hint.
func (f *FS) Record(digest string) (stop func() error, err error) {
	b, err := f.blob(digest)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	r := b.rec.Load()
	if r == nil {
		r = &recorder{seen: map[int]bool{}}
		b.rec.Store(r)
	}
	r.mu.Lock()
	r.users++
	r.mu.Unlock()
	f.mu.Unlock()
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() {
			f.mu.Lock()
			r.mu.Lock()
			r.users--
			last := r.users == 0
			order := append([]int(nil), r.order...)
			r.mu.Unlock()
			if last {
				b.rec.Store(nil)
			}
			f.mu.Unlock()
			if last {
				err = b.mergeHint(order)
			}
		})
		return err
	}, nil
}

// Hint returns blob digest's recorded chunks, in first-read order.
func (f *FS) Hint(digest string) ([]int, error) {
	b, err := f.blob(digest)
	if err != nil {
		return nil, err
	}
	return b.readHint()
}

func (b *blobFile) readHint() ([]int, error) {
	raw, err := os.ReadFile(b.base + ".hint")
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var hint []int
	if err := json.Unmarshal(raw, &hint); err != nil {
		return nil, fmt.Errorf("hint of %s: %w", b.digest, err)
	}
	out := hint[:0]
	for _, i := range hint {
		if i >= 0 && i < b.m.NumChunks() {
			out = append(out, i)
		}
	}
	return out, nil
}

// mergeHint appends chunks not yet in the hint file.
func (b *blobFile) mergeHint(chunks []int) error {
	hint, err := b.readHint()
	if err != nil {
		hint = nil // a damaged hint is only a lost optimisation
	}
	seen := map[int]bool{}
	for _, i := range hint {
		seen[i] = true
	}
	for _, i := range chunks {
		if !seen[i] {
			seen[i] = true
			hint = append(hint, i)
		}
	}
	raw, err := json.Marshal(hint)
	if err != nil {
		return err
	}
	tmp := b.base + ".hint.tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return fmt.Errorf("hint of %s: %w", b.digest, err)
	}
	return os.Rename(tmp, b.base+".hint")
}

// PrefetchMode says what Prefetch fetches, and how eagerly.
type PrefetchMode int

const (
	// PrefetchHint fetches the recorded hint's chunks, hintWorkers at a
	// time: they are what the starting sandbox is about to read, so they
	// compete with its reads on purpose.
	PrefetchHint PrefetchMode = iota
	// PrefetchWhole fetches the hint's chunks, then every other, one at a
	// time and only while no reader waits for a fetch (low priority).
	PrefetchWhole
)

// hintWorkers is how many hint chunks are fetched at once: enough to fill
// a link whose per-request latency would otherwise dominate.
const hintWorkers = 4

// Prefetch fetches blob digest's chunks as mode says. It returns when
// done, on the first failed fetch, or when ctx ends.
func (f *FS) Prefetch(ctx context.Context, digest string, mode PrefetchMode) error {
	b, err := f.blob(digest)
	if err != nil {
		return err
	}
	order, err := b.readHint()
	if err != nil {
		return err
	}
	workers, yield := hintWorkers, false
	if mode == PrefetchWhole {
		workers, yield = 1, true
		in := map[int]bool{}
		for _, i := range order {
			in[i] = true
		}
		for i := range b.m.NumChunks() {
			if !in[i] {
				order = append(order, i)
			}
		}
	}
	next := make(chan int)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := b.prefetchChunk(ctx, i); err != nil {
					errs <- err
					cancel()
					return
				}
			}
		})
	}
feed:
	for _, i := range order {
		for yield && f.foreground.Load() > 0 { // readers first
			if blob.Sleep(ctx, 2*time.Millisecond) != nil {
				break feed
			}
		}
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return fmt.Errorf("prefetch %s: %w", digest, err)
	default:
		return ctx.Err()
	}
}

func (b *blobFile) prefetchChunk(ctx context.Context, i int) error {
	b.mu.RLock()
	present := b.has(i)
	b.mu.RUnlock()
	if present {
		return nil
	}
	if _, err := b.fetch(ctx, nil, i); err != nil {
		return err
	}
	_, n := b.m.ChunkRange(i)
	b.prefetched.Add(n)
	return nil
}

// StartPrefetch runs Prefetch in the background until it is done or the
// FS closes; failures are logged (reads report their own).
func (f *FS) StartPrefetch(digest string, mode PrefetchMode) {
	go func() {
		if err := f.Prefetch(f.ctx, digest, mode); err != nil && f.ctx.Err() == nil {
			f.cfg.Log.Warn("lazy blob: prefetch", "blob", digest, "err", err)
		}
	}()
}
