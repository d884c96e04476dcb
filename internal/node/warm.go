package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/state"
	"github.com/corral-dev/corral/internal/storage/layers"
)

// The warm pool keeps a few container sandboxes made ahead of demand, per
// image, for creates that ask for the node's defaults (resources, network
// none, no I/O limits): such a create takes one (a record write and its
// admission) instead of making one, and the pool makes the next in the
// background. A pooled sandbox has an id and nothing else of a sandbox: no
// record, no project, no labels. Those come at hand-out, and nothing the
// sandbox was made with depends on them (its layers are the node's shared
// mounts, so pools are off with per-project layer mounts). A pooled
// sandbox has no record, so a daemon that dies with some leaves them to
// the backend's sweep at the next start, like any half-made sandbox.
//
// With Config.Recycle, every container sandbox with network none is made
// recyclable, whatever its resources, and a delete of one scrubs it (every
// process killed, what they left in its kernel namespaces removed: the
// delete answers then) and, off the request path, renews it (a fresh disk
// if it was written to, usage figures from zero) and puts it back in its
// image's pool instead of tearing it down, up to Config.Recycle per image.
// A recycled sandbox goes only to a later create of the project it served
// (projects share nothing through it) that asks for the same resources
// (its cgroups and disk were made for them), under a new id; its record's
// BackendID keeps the name its backend knows it by. An RL job creates the
// same kind of sandbox over and over, default or not.
//
// With Config.BoundRecyclable (the init stub's nodes, whose plain
// sandboxes cost a seventh of a recyclable one's host PIDs held idle), an
// image has at most Config.Recycle recyclable sandboxes, in use or pooled:
// beyond, a create makes a plain one, unless the pool holds a recycled
// sandbox of another class, which goes for it (a sandbox made ahead of
// demand is made plain then). A job that cycles a few sandboxes at a time
// recycles them; one that holds thousands idle holds plain ones.

// maxWarmImages bounds how many images have a pool; a request for another
// image drains the pool used least recently.
const maxWarmImages = 4

// warmBackend is the only backend pooled: fncall keeps its own pool, and
// VMs hold too much to keep idle ones.
const warmBackend = "container"

// warmSandbox is one pooled sandbox.
type warmSandbox struct {
	id  string // its backend name, and a made one's id at hand-out
	sb  backend.Sandbox
	img layers.Image
	// pin is the image store's holder keeping its layers while pooled.
	pin string
	// recycled: it served project before (and goes to no other).
	recycled bool
	project  string
	// res is what it was made with: it goes to creates that ask for the same.
	res backend.Resources
}

// recyclePin is the image store's holder of a recycled sandbox's layers
// while it waits in a pool (its own id may be a record's holder still).
func recyclePin(id string) string { return "recycled/" + id }

// warmPool is the pool of one image.
type warmPool struct {
	image   string
	ready   []*warmSandbox
	used    time.Time     // last hand-out or miss
	wake    chan struct{} // a hand-out happened (buffered 1)
	stop    chan struct{} // closed when the pool is drained
	stopped bool
}

// warmPools are the node's pools (Config.WarmPool sandboxes made each,
// and up to Config.Recycle recycled ones).
type warmPools struct {
	n       *Node
	size    int
	recycle int
	bound   bool // Config.BoundRecyclable

	mu     sync.Mutex
	pools  map[string]*warmPool
	closed bool
	// held counts each image's recyclable sandboxes that records hold
	// (entry.recyclable), for BoundRecyclable.
	held map[string]int
	// draining: the node deletes every sandbox before it exits (Shutdown),
	// so deletes tear down instead of recycling.
	draining atomic.Bool
	wg       sync.WaitGroup // fillers and drains
	ctx      context.Context
	cancel   context.CancelFunc
}

func newWarmPools(n *Node, size, recycle int) *warmPools {
	ctx, cancel := context.WithCancel(context.Background())
	w := &warmPools{n: n, size: size, recycle: recycle, bound: n.cfg.BoundRecyclable, pools: map[string]*warmPool{}, held: map[string]int{}, ctx: ctx, cancel: cancel}
	n.mu.Lock()
	for _, e := range n.sandboxes { // those recovered at start
		if e.recyclable {
			w.held[e.rec.Image]++
		}
	}
	n.mu.Unlock()
	if _, ok := n.backends[warmBackend]; ok && size > 0 {
		w.mu.Lock()
		w.poolLocked(n.cfg.Defaults.Image)
		w.mu.Unlock()
	}
	return w
}

// template is the record of a default container create of image.
func (w *warmPools) template(image string) (*state.Record, error) {
	return w.n.admit(CreateRequest{Backend: warmBackend, Image: image})
}

// poolable says whether a sandbox for rec may come from, or go to, a pool:
// a container sandbox with network none that was not asked to be fresh, on
// a node with pools.
func (w *warmPools) poolable(rec *state.Record) bool {
	if _, ok := w.n.backends[warmBackend]; !ok || (w.size <= 0 && w.recycle <= 0) || rec.Backend != warmBackend || w.n.cfg.PerProjectLayerMounts || rec.Fresh {
		return false
	}
	return (rec.NetworkMode == "" || rec.NetworkMode == "none") && len(rec.NetworkAllow) == 0
}

// matches says whether rec may take a sandbox made ahead of demand:
// everything the backend made it with is the node's default.
func (w *warmPools) matches(rec *state.Record) bool {
	if !w.poolable(rec) {
		return false
	}
	t, err := w.template(rec.Image)
	if err != nil {
		return false
	}
	return resourcesOf(rec) == resourcesOf(t)
}

// resourcesOf is what the backend makes a sandbox of rec with, besides its
// image, id and network.
func resourcesOf(rec *state.Record) backend.Resources { return specOf(rec, layers.Image{}).Resources }

// recyclable says whether a sandbox for rec is made recyclable.
func (w *warmPools) recyclable(rec *state.Record) bool {
	return w != nil && w.recycle > 0 && w.poolable(rec)
}

// isRecyclable says whether sb was made recyclable.
func isRecyclable(sb backend.Sandbox) bool {
	r, ok := sb.(backend.Recycler)
	return ok && r.Recyclable()
}

// claim says whether a create from scratch for rec makes a recyclable
// sandbox, and if so counts it held (unclaim undoes that when the create
// fails). An image at its bound (BoundRecyclable) makes room by letting
// its oldest pooled recycled sandbox go (of another class: the create
// found none of its own), else the create makes a plain sandbox.
func (w *warmPools) claim(rec *state.Record) bool {
	if !w.recyclable(rec) {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.roomLocked(rec.Image) && !w.evictLocked(w.pools[rec.Image]) {
		return false
	}
	w.holdLocked(rec.Image)
	return true
}

// roomLocked says whether image may have one more recyclable sandbox.
func (w *warmPools) roomLocked(image string) bool {
	return !w.bound || w.held[image]+w.pooledLocked(image) < w.recycle
}

// unclaim ends the count of a held recyclable sandbox of image: its create
// failed, or its record was deleted (and it was pooled or stopped).
func (w *warmPools) unclaim(image string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.held[image]--; w.held[image] <= 0 {
		delete(w.held, image)
	}
}

// holdLocked counts a recyclable sandbox of image that a record holds now.
func (w *warmPools) holdLocked(image string) {
	w.held[image]++
}

// pooledLocked is how many recyclable sandboxes image's pool holds.
func (w *warmPools) pooledLocked(image string) int {
	n := 0
	if p, ok := w.pools[image]; ok {
		for _, ws := range p.ready {
			if isRecyclable(ws.sb) {
				n++
			}
		}
	}
	return n
}

// evictLocked destroys the least recently pooled recycled sandbox of p;
// false when p (nil: no pool) holds none.
func (w *warmPools) evictLocked(p *warmPool) bool {
	if p == nil {
		return false
	}
	i := len(p.ready) - 1
	for i >= 0 && !p.ready[i].recycled {
		i--
	}
	if i < 0 {
		return false
	}
	w.discardLocked(p.ready[i])
	p.ready = slices.Delete(p.ready, i, i+1)
	w.n.cfg.Metrics.CountRecycle("evicted")
	return true
}

// mayRecycle says whether a delete of sb (record rec) recycles it: a
// running sandbox made recyclable, whose pool class still fits.
func (w *warmPools) mayRecycle(rec *state.Record, sb backend.Sandbox) bool {
	if !isRecyclable(sb) || rec.Phase != state.PhaseRunning || rec.Reclaimed || !w.recyclable(rec) {
		return false
	}
	return !w.draining.Load()
}

// poolLocked returns image's pool, making it (and its filler) if needed,
// and draining the least recently used pool beyond maxWarmImages.
func (w *warmPools) poolLocked(image string) *warmPool {
	if p, ok := w.pools[image]; ok {
		return p
	}
	if w.closed {
		return nil
	}
	if len(w.pools) >= maxWarmImages {
		var oldest *warmPool
		for _, p := range w.pools {
			if oldest == nil || p.used.Before(oldest.used) {
				oldest = p
			}
		}
		w.drainLocked(oldest)
	}
	p := &warmPool{image: image, used: time.Now(), wake: make(chan struct{}, 1), stop: make(chan struct{})}
	w.pools[image] = p
	w.wg.Add(1)
	go w.fill(p)
	return p
}

// drainLocked removes p and destroys its sandboxes in the background.
func (w *warmPools) drainLocked(p *warmPool) {
	delete(w.pools, p.image)
	p.stopped = true
	close(p.stop)
	ready := p.ready
	p.ready = nil
	for _, ws := range ready {
		w.discardLocked(ws)
	}
}

// capLocked is how many sandboxes a pool holds at most.
func (w *warmPools) capLocked() int { return max(w.size, w.recycle) }

// discardLocked destroys a pooled sandbox in the background; once the
// pools are closed (close waits for the background), right away.
func (w *warmPools) discardLocked(ws *warmSandbox) {
	if w.closed {
		w.destroy(ws.id, ws.pin, ws.sb)
		return
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		w.destroy(ws.id, ws.pin, ws.sb)
	}()
}

// destroy stops and removes pooled sandbox id and drops its layers' pin.
func (w *warmPools) destroy(id, pin string, sb backend.Sandbox) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := w.n.backends[warmBackend]
	if sb != nil {
		if err := sb.Stop(ctx); err != nil {
			w.n.log.Warn("warm pool: stop a pooled sandbox", "sandbox", id, "err", err)
		}
	}
	if err := b.Cleanup(ctx, id, nil); err != nil {
		// No record names it: the sweep at the next start retries.
		w.n.log.Error("warm pool: remove a pooled sandbox", "sandbox", id, "err", err)
	}
	w.n.cfg.Images.Release(pin)
}

// take returns a pooled sandbox of image made with res that project may
// have, or nil, and wakes the pool's filler: one recycled from project's
// own deletes first (no other project may take it), else, if made is
// set (res is the default), one made ahead of demand.
func (w *warmPools) take(image, project string, res backend.Resources, made bool) *warmSandbox {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.pools[image]
	if !ok {
		return nil
	}
	p.used = time.Now()
	var ws *warmSandbox
	for ws == nil {
		i := slices.IndexFunc(p.ready, func(c *warmSandbox) bool { return c.recycled && c.project == project && c.res == res })
		if i < 0 && made {
			i = slices.IndexFunc(p.ready, func(c *warmSandbox) bool { return !c.recycled })
		}
		if i < 0 {
			break
		}
		c := p.ready[i]
		p.ready = slices.Delete(p.ready, i, i+1)
		select {
		case <-c.sb.Done(): // its init died while pooled
			w.discardLocked(c)
		default:
			ws = c
		}
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return ws
}

// putBack returns an unused sandbox to its pool (a hand-out that was
// refused admission), or destroys it if the pool is gone or full.
func (w *warmPools) putBack(image string, ws *warmSandbox) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p, ok := w.pools[image]; ok && !p.stopped && len(p.ready) < w.capLocked() {
		p.ready = append([]*warmSandbox{ws}, p.ready...)
		return
	}
	w.discardLocked(ws)
}

// putRecycled puts a renewed sandbox at the front of image's pool (the
// warmest first). A full pool lets its least recently pooled recycled
// sandbox go for it: the classes (project, resources) a node recycles
// change with its jobs, and the newest is the likeliest to be asked for
// again. False when the pool is gone or full of sandboxes made ahead of
// demand (the caller destroys it).
func (w *warmPools) putRecycled(image string, ws *warmSandbox) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.poolLocked(image)
	if p == nil || p.stopped {
		return false
	}
	if len(p.ready) >= w.capLocked() && !w.evictLocked(p) {
		return false
	}
	p.ready = append([]*warmSandbox{ws}, p.ready...)
	return true
}

// fill keeps p at size sandboxes, one made at a time, until p is drained
// or the pools close. A failed make (image missing, host at a limit)
// waits, doubling up to a minute.
func (w *warmPools) fill(p *warmPool) {
	defer w.wg.Done()
	var backoff, delay time.Duration
	for {
		w.mu.Lock()
		need := !p.stopped && !w.closed && len(p.ready) < w.size
		w.mu.Unlock()
		if !need || delay > 0 {
			var retry <-chan time.Time
			if delay > 0 {
				retry = time.After(delay)
			}
			select {
			case <-w.ctx.Done():
				return
			case <-p.stop:
				return
			case <-p.wake: // a request asks: try again now
			case <-retry:
			}
			delay = 0
			continue
		}
		ws, err := w.make(p.image)
		if err != nil {
			backoff = min(max(2*backoff, time.Second), time.Minute)
			delay = backoff
			w.n.log.Debug("warm pool: make a sandbox", "image", p.image, "err", err, "retry_in", backoff)
			continue
		}
		backoff = 0
		w.mu.Lock()
		if p.stopped || w.closed || len(p.ready) >= w.size {
			w.discardLocked(ws)
		} else {
			p.ready = append(p.ready, ws)
		}
		w.mu.Unlock()
	}
}

// make creates one pooled sandbox of image, admitted like a create (host
// limits) so that the pool never takes what the node would refuse.
func (w *warmPools) make(image string) (*warmSandbox, error) {
	n := w.n
	rec, err := w.template(image)
	if err != nil {
		return nil, err
	}
	if rec.ID, err = n.newID(); err != nil {
		return nil, err
	}
	if err := n.reserve(w.ctx, rec); err != nil {
		return nil, err
	}
	defer n.unreserve(rec)
	img, err := n.cfg.Images.AcquireIn(w.ctx, image, rec.ID, "")
	if err != nil {
		return nil, err
	}
	b := n.backends[warmBackend]
	spec := specOf(rec, img)
	if w.recyclable(rec) {
		w.mu.Lock()
		spec.Recyclable = w.roomLocked(image)
		w.mu.Unlock()
	}
	sb, err := b.Create(w.ctx, spec)
	if err != nil {
		w.destroy(rec.ID, rec.ID, nil)
		return nil, err
	}
	return &warmSandbox{id: rec.ID, sb: sb, img: img, pin: rec.ID, res: resourcesOf(rec)}, nil
}

// handOut gives rec (admitted, not yet reserved) a pooled sandbox when the
// pool has one it may take: ok false means make one as usual.
func (w *warmPools) handOut(ctx context.Context, rec *state.Record, b backend.Backend, start time.Time) (*Sandbox, bool, error) {
	if w == nil || !w.poolable(rec) {
		return nil, false, nil
	}
	made := w.matches(rec)
	if !made && w.recycle <= 0 {
		return nil, false, nil
	}
	ws := w.take(rec.Image, rec.Project, resourcesOf(rec), made)
	if ws == nil {
		return nil, false, nil
	}
	n := w.n
	r := *rec
	r.ID = ws.id
	if ws.recycled {
		// A new sandbox to its caller: a new id; the backend keeps its name.
		id, err := n.newID()
		if err != nil {
			w.putBack(rec.Image, ws)
			return nil, true, fmt.Errorf("sandbox id: %w", err)
		}
		r.ID, r.BackendID = id, ws.id
	}
	if err := n.reserve(ctx, &r); err != nil {
		w.putBack(rec.Image, ws)
		return nil, true, err
	}
	defer n.unreserve(&r)
	// The name may point at other layers by now: pin what it names, and
	// hand out only a sandbox made from exactly those.
	img, err := n.cfg.Images.AcquireIn(ctx, r.Image, r.ID, "")
	if err != nil || !sameStack(img.Stack, ws.img.Stack) {
		if err == nil && r.ID != ws.pin {
			n.cfg.Images.Release(r.ID)
		}
		w.mu.Lock()
		w.discardLocked(ws)
		w.mu.Unlock()
		return nil, false, nil
	}
	if ws.pin != r.ID {
		n.cfg.Images.Release(ws.pin) // r.ID holds them now
	}
	r.Env = mergeEnv(img.Env, r.Env)
	r.Layers = stateLayers(img.Stack)
	source := "made"
	if ws.recycled {
		source = "recycled"
	}
	n.cfg.Metrics.CountHandout(source)
	if isRecyclable(ws.sb) {
		w.mu.Lock()
		w.holdLocked(r.Image)
		w.mu.Unlock()
	}
	// One record write: until it, nothing names the sandbox, and a crash
	// leaves it to the sweep.
	return n.started(&r, b, ws.sb, start, true), true, nil
}

// sameStack says whether two stacks are the same layers (by digest).
func sameStack(a, b []layers.Layer) bool {
	return slices.EqualFunc(a, b, func(x, y layers.Layer) bool { return x.Digest == y.Digest })
}

// renewAndPool renews a deleted sandbox that Delete scrubbed and puts it
// back in its image's pool for its project (or destroys it when the pool
// has no room), and forgets rec. False when the renew failed: the sandbox
// is stopped, and rec is left to the caller's teardown.
func (w *warmPools) renewAndPool(rec *state.Record, sb backend.Sandbox) bool {
	n := w.n
	// Held until pooled or stopped: a create meanwhile does not take its
	// place (BoundRecyclable).
	defer w.unclaim(rec.Image)
	ctx, cancel := context.WithTimeout(w.ctx, time.Minute)
	defer cancel()
	start := time.Now()
	if err := sb.(backend.Recycler).Renew(ctx); err != nil {
		n.log.Warn("recycle a deleted sandbox: renew failed; tearing it down", "sandbox", rec.ID, "err", err)
		n.cfg.Metrics.CountRecycle("torn_down")
		if err := sb.Stop(context.WithoutCancel(ctx)); err != nil {
			n.log.Warn("stop a sandbox whose renew failed", "sandbox", rec.ID, "err", err)
		}
		return false
	}
	name := rec.BackendName()
	stack := imageLayers(rec.Layers)
	ws := &warmSandbox{id: name, sb: sb, img: layers.Image{Stack: stack}, pin: recyclePin(name), recycled: true, project: rec.Project, res: resourcesOf(rec)}
	n.cfg.Images.Pin(ws.pin, stack)
	outcome := "pooled"
	if !w.putRecycled(rec.Image, ws) {
		outcome = "torn_down"
		w.destroy(ws.id, ws.pin, sb)
	}
	n.forget(rec)
	n.cfg.Metrics.CountRecycle(outcome)
	n.log.Debug("sandbox recycled", "sandbox", rec.ID, "as", name, "project", projectOf(rec), "outcome", outcome, "took", time.Since(start))
	return true
}

// made notes a sandbox made from scratch for rec: if such creates may
// take pooled sandboxes, its image gets a pool (only images that exist do,
// so that names that resolve to nothing never push a pool out).
func (w *warmPools) made(rec *state.Record) {
	if w == nil || !w.matches(rec) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if p := w.poolLocked(rec.Image); p != nil {
		p.used = time.Now()
	}
}

// close stops the fillers and destroys every pooled sandbox.
func (w *warmPools) close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.closed = true
	for _, p := range w.pools {
		w.drainLocked(p)
	}
	w.mu.Unlock()
	w.cancel()
	w.wg.Wait()
}
