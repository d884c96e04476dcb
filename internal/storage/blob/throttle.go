package blob

import (
	"context"
	"io"
	"sync"
	"time"
)

// Link models the network path to a remote store: every request waits
// Latency before its first byte, and all bytes of all requests share
// BytesPerSec (one pipe, as a node's uplink to a shared store is). The
// benchmark uses it to make a store on loopback behave like a remote one.
type Link struct {
	BytesPerSec int64         // 0: unlimited
	Latency     time.Duration // per request

	mu   sync.Mutex
	next time.Time // when the pipe is free again
}

// Throttle returns s seen through link; Put is not throttled (publishing
// is not what the benchmark measures).
func Throttle(s Store, link *Link) Store { return &throttled{Store: s, link: link} }

type throttled struct {
	Store
	link *Link
}

func (t *throttled) Stat(ctx context.Context, key string) (int64, error) {
	if err := Sleep(ctx, t.link.Latency); err != nil {
		return 0, err
	}
	return t.Store.Stat(ctx, key)
}

func (t *throttled) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := Sleep(ctx, t.link.Latency); err != nil {
		return nil, err
	}
	rc, err := t.Store.GetRange(ctx, key, off, n)
	if err != nil {
		return nil, err
	}
	return &paced{rc: rc, ctx: ctx, link: t.link}, nil
}

// wait reserves the pipe for n bytes and returns how long to sleep.
func (l *Link) wait(n int) time.Duration {
	if l.BytesPerSec <= 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.next.Before(now) {
		l.next = now
	}
	l.next = l.next.Add(time.Duration(int64(n) * int64(time.Second) / l.BytesPerSec))
	return l.next.Sub(now)
}

type paced struct {
	rc   io.ReadCloser
	ctx  context.Context
	link *Link
}

func (p *paced) Read(b []byte) (int, error) {
	if len(b) > 64<<10 { // small steps keep concurrent readers interleaved
		b = b[:64<<10]
	}
	n, err := p.rc.Read(b)
	if n > 0 {
		if werr := Sleep(p.ctx, p.link.wait(n)); werr != nil {
			return n, werr
		}
	}
	return n, err
}

func (p *paced) Close() error { return p.rc.Close() }

// Sleep waits d, or until ctx ends (then it returns ctx's error).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
