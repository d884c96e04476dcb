package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/corral-dev/corral/client"
)

// LabelKey marks every sandbox a benchmark creates; its value is random per
// run, so a run's safety-net sweep deletes only its own sandboxes.
const LabelKey = "corral-bench"

// cleanupTimeout bounds the final sweep, which runs on a context of its own
// so that it still works after Ctrl-C cancelled the run's.
const cleanupTimeout = 5 * time.Minute

// tracker creates sandboxes with the run's label and deletes whatever is
// left of them at the end, even when the run failed or was cancelled.
type tracker struct {
	c     *client.Client
	label string

	mu   sync.Mutex
	live map[string]struct{}
}

func newTracker(c *client.Client) *tracker {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return &tracker{c: c, label: hex.EncodeToString(b), live: map[string]struct{}{}}
}

// create makes a sandbox labelled for this run; o.Labels is copied, not kept.
func (t *tracker) create(ctx context.Context, o client.CreateOptions) (*client.Sandbox, error) {
	labels := map[string]string{LabelKey: t.label}
	for k, v := range o.Labels {
		labels[k] = v
	}
	o.Labels = labels
	if o.MaxLifetime == nil {
		// If both this process and its sweep die, the server still reaps.
		life := 2 * time.Hour
		o.MaxLifetime = &life
	}
	sb, err := t.c.Create(ctx, o)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	t.live[sb.ID()] = struct{}{}
	t.mu.Unlock()
	return sb, nil
}

// delete removes one sandbox and forgets it.
func (t *tracker) delete(ctx context.Context, sb *client.Sandbox) error {
	if err := sb.Delete(ctx); err != nil {
		return err
	}
	t.mu.Lock()
	delete(t.live, sb.ID())
	t.mu.Unlock()
	return nil
}

// deleteForks deletes the sandboxes that forks made (each tracked first, so
// that the final sweep gets it should the delete fail), even after ctx
// ends, and returns how many forks failed.
func (t *tracker) deleteForks(ctx context.Context, forks []client.ForkOutcome) (failed int) {
	for _, fk := range forks {
		if fk.Err != nil {
			failed++
			continue
		}
		t.mu.Lock()
		t.live[fk.Sandbox.ID()] = struct{}{}
		t.mu.Unlock()
		_ = t.delete(context.WithoutCancel(ctx), fk.Sandbox)
	}
	return failed
}

// remaining lists this run's sandboxes the server still knows.
func (t *tracker) remaining(ctx context.Context) ([]string, error) {
	infos, err := t.c.List(ctx, client.ListOptions{Labels: map[string]string{LabelKey: t.label}})
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(infos))
	for _, in := range infos {
		ids = append(ids, in.ID)
	}
	return ids, nil
}

// sweep deletes every sandbox this run created and still holds, then every
// sandbox the server lists with the run's label. It ignores the caller's
// cancellation (it is what runs after Ctrl-C) and returns how many it found
// left by List before deleting them.
func (t *tracker) sweep(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	t.mu.Lock()
	ids := make([]string, 0, len(t.live))
	for id := range t.live {
		ids = append(ids, id)
	}
	t.mu.Unlock()
	errs := t.deleteAll(ctx, ids)
	left, err := t.remaining(ctx)
	if err != nil {
		return 0, errors.Join(errs, fmt.Errorf("list sandboxes labelled %s=%s: %w", LabelKey, t.label, err))
	}
	return len(left), errors.Join(errs, t.deleteAll(ctx, left))
}

func (t *tracker) deleteAll(ctx context.Context, ids []string) error {
	var mu sync.Mutex
	var errs []error
	parallel(ctx, len(ids), 8, func(ctx context.Context, i int) {
		if err := t.delete(ctx, t.c.Sandbox(ids[i])); err != nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("delete %s: %w", ids[i], err))
			mu.Unlock()
		}
	})
	return errors.Join(errs...)
}

// parallel calls fn(i) for i in [0,n) on at most conc goroutines, stopping
// handing out work once ctx is done.
func parallel(ctx context.Context, n, conc int, fn func(ctx context.Context, i int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(1, min(conc, n)) {
		wg.Go(func() {
			for i := range next {
				fn(ctx, i)
			}
		})
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
}

// finish ends a benchmark run: it records the end load, sweeps what the run
// made (leaked becomes the larger of its value and what the sweep found
// left) and joins the sweep's error to err.
func (t *tracker) finish(ctx context.Context, load *Load, leaked *int, err error) error {
	load.End = loadAvg()
	left, serr := t.sweep(ctx)
	*leaked = max(*leaked, left)
	return errors.Join(err, serr)
}
