package fncall

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

// poolKey selects a pool: sandboxes of one image and memory limit.
type poolKey struct {
	image  string
	memory int64
}

// holder names the pool to the image store, which keeps its layers.
func (k poolKey) holder() string { return fmt.Sprintf("fncall-pool/%s/%d", k.image, k.memory) }

// pool is the warm sandboxes of one key. Idle sandboxes are reused LIFO
// (the most recently used is the warmest in caches); the target size
// follows the recent call rate and call time (Little's law, with headroom)
// between the floor and ceiling; a background loop refills and trims.
type pool struct {
	svc *Service
	key poolKey
	// env is what a call gets of its image's environment unless it sets
	// the name itself: SSL_CERT_FILE (the node's CA bundle) only, since
	// calls otherwise run with fncall's own minimal environment.
	env []string

	mu       sync.Mutex
	idle     []backend.Sandbox // a stack
	total    int               // idle + in use + being created
	rate     float64           // calls per second, EWMA
	busy     float64           // seconds per call, EWMA
	inUse    int               // sandboxes out of the pool
	peakUse  float64           // recent peak of inUse, decaying with ewmaTau
	last     time.Time         // of the last rate update
	freed    chan struct{}     // signalled when a sandbox is put back
	wake     chan struct{}
	closed   bool
	loopDone chan struct{}
}

// ewmaTau is the time constant of the call rate average.
const ewmaTau = 2 * time.Second

func newPool(svc *Service, key poolKey) *pool {
	p := &pool{svc: svc, key: key, last: time.Now(), freed: make(chan struct{}, 1),
		wake: make(chan struct{}, 1), loopDone: make(chan struct{})}
	go p.loop()
	return p
}

// target is the wanted number of sandboxes: the sandboxes busy at the
// recent call rate (Little's law: rate x time out of the pool), or the
// recent peak in use if higher, with half again as headroom.
func (p *pool) target() int {
	cfg := p.svc.cfg
	decay := math.Exp(-time.Since(p.last).Seconds() / ewmaTau.Seconds())
	busy := max(p.rate*max(p.busy, 0.001), p.peakUse) * decay
	want := int(math.Ceil(busy*1.5)) + 1
	return min(max(want, cfg.PoolFloor), cfg.PoolCeiling)
}

// noteCall updates the averages with one call taking a sandbox.
func (p *pool) noteCall() {
	now := time.Now()
	dt := max(now.Sub(p.last).Seconds(), 1e-6)
	a := math.Exp(-dt / ewmaTau.Seconds())
	p.rate = p.rate*a + (1-a)/dt
	p.inUse++
	p.peakUse = max(p.peakUse*a, float64(p.inUse))
	p.last = now
}

// noteBusy updates the call time average as a sandbox comes back (or a
// creation for a call failed).
func (p *pool) noteBusy(d time.Duration) {
	p.mu.Lock()
	p.busy = p.busy*0.9 + d.Seconds()*0.1
	p.inUse--
	p.mu.Unlock()
}

// get returns a sandbox: an idle one, else a fresh one made here (never
// waiting for the refill loop), else, at the ceiling, the next one put back.
func (p *pool) get(ctx context.Context) (backend.Sandbox, time.Time, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, time.Time{}, errClosed
		}
		p.kick()
		if n := len(p.idle); n > 0 {
			sb := p.idle[n-1]
			p.idle = p.idle[:n-1]
			if dead(sb) {
				p.mu.Unlock()
				p.svc.log.Warn("fncall: an idle pooled sandbox had died; destroying it", "sandbox", sb.ID())
				go p.destroy(sb)
				continue
			}
			p.noteCall()
			p.mu.Unlock()
			return sb, time.Now(), nil
		}
		if p.total < p.svc.cfg.PoolCeiling {
			p.total++
			p.noteCall()
			p.mu.Unlock()
			start := time.Now()
			sb, err := p.svc.create(ctx, p.key)
			if err != nil {
				p.noteBusy(0)
				p.drop()
			}
			return sb, start, err
		}
		p.mu.Unlock()
		select {
		case <-p.freed:
		case <-ctx.Done():
			return nil, time.Time{}, ctx.Err()
		}
	}
}

var errClosed = errors.New("fncall: service closed")

// dead reports whether sb's processes are gone.
func dead(sb backend.Sandbox) bool { return diedBy(sb, 0) }

// diedBy reports whether sb's processes are gone within wait: a failure
// caused by a dying sandbox can come before its Done is closed.
func diedBy(sb backend.Sandbox, wait time.Duration) bool {
	if wait <= 0 {
		select {
		case <-sb.Done():
			return true
		default:
			return false
		}
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-sb.Done():
		return true
	case <-t.C:
		return false
	}
}

// kick wakes the refill loop (p.mu held or not).
func (p *pool) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// release resets sb off the caller's path and puts it back, or destroys it
// when the reset fails. The time from get to put counts as busy time.
func (p *pool) release(sb backend.Sandbox, since time.Time) {
	go func() {
		defer func() { p.noteBusy(time.Since(since)) }()
		ctx, cancel := context.WithTimeout(context.Background(), p.svc.cfg.ResetTimeout)
		dirty, err := sb.(backend.Resetter).Reset(ctx, p.svc.warm.keep(sb))
		cancel()
		if err != nil {
			p.svc.log.Warn("fncall: reset failed; destroying the sandbox", "sandbox", sb.ID(), "err", err)
			p.destroy(sb)
			return
		}
		if dirty {
			p.svc.warm.drop(sb) // the reset killed it with the old view
		}
		p.put(sb)
	}()
}

func (p *pool) put(sb backend.Sandbox) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.destroy(sb)
		return
	}
	p.idle = append(p.idle, sb)
	p.mu.Unlock()
	select {
	case p.freed <- struct{}{}:
	default:
	}
}

// destroy stops and cleans up a sandbox of the pool.
func (p *pool) destroy(sb backend.Sandbox) {
	p.svc.destroy(sb)
	p.drop()
}

func (p *pool) drop() {
	p.mu.Lock()
	p.total--
	p.mu.Unlock()
	select {
	case p.freed <- struct{}{}:
	default:
	}
}

// loop refills the pool up to its target and trims idle sandboxes above it.
func (p *pool) loop() {
	defer close(p.loopDone)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		trim := false
		select {
		case <-p.wake:
		case <-tick.C:
			trim = true
		case <-p.svc.done:
			return
		}
		for p.step(trim) {
			trim = false
		}
	}
}

// step makes a sandbox when the pool is below its target, or (with trim:
// once per tick, so that a short lull does not empty the pool) destroys
// the coldest idle one when above; it reports whether to go on.
func (p *pool) step(trim bool) bool {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	target := p.target()
	switch {
	case p.total < target:
		p.total++
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), p.svc.cfg.CreateTimeout)
		sb, err := p.svc.create(ctx, p.key)
		cancel()
		if err != nil {
			p.drop()
			p.svc.log.Warn("fncall: refill failed", "image", p.key.image, "err", err)
			return false
		}
		p.put(sb)
		return true
	case trim && len(p.idle) > 0 && p.total > target:
		sb := p.idle[0] // the coldest
		p.idle = p.idle[1:]
		p.mu.Unlock()
		p.destroy(sb)
		return true
	}
	p.mu.Unlock()
	return false
}

// close destroys the idle sandboxes; those in use are destroyed when put
// back.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	<-p.loopDone
	for _, sb := range idle {
		p.destroy(sb)
	}
}

// drained reports whether every sandbox of the pool is gone.
func (p *pool) drained() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total == 0
}
