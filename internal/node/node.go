// Package node owns the sandboxes of one machine: admission (validation and
// defaults), lifecycle, TTLs, routing of exec/file calls to backends, and
// recovery after a daemon restart. Its records live in internal/state. It
// imports backends only through the backend interface, and storage/layers,
// state, execlog, events, metrics, netpolicy and errdefs; it must not import
// a backend implementation or the API, control or server layers.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/execlog"
	"github.com/corral-dev/corral/internal/metrics"
	"github.com/corral-dev/corral/internal/state"
	"github.com/corral-dev/corral/internal/storage/layers"
)

// Images resolves image names to read-only layers and keeps the layers of
// every sandbox from being deleted while its record exists.
type Images interface {
	// AcquireIn resolves and mounts name in the mount scope scope ("":
	// the node's shared mounts) and pins its layers for holder.
	AcquireIn(ctx context.Context, name, holder, scope string) (layers.Image, error)
	// Pin pins layers for holder again after a daemon restart.
	Pin(holder string, stack []layers.Layer)
	// Release drops holder's pins.
	Release(holder string)
	// CheckFree fails when a layer or composition is called ref.
	CheckFree(ref string) error
	// Pack makes a layer of a sandbox's upper directory.
	Pack(ctx context.Context, upper string, opts layers.PackOptions) (layers.Layer, error)
	CreateComposition(ctx context.Context, c layers.Composition) (layers.Composition, error)
}

// Config configures a node.
type Config struct {
	// DataDir holds the node's state database.
	DataDir string
	// State is the node's state database when the caller opened it (to
	// share it with the backends, e.g. for their id ranges); the node
	// closes it. Nil: the node opens DataDir/state.db itself.
	State    *state.DB
	Backends []backend.Backend
	Images   Images
	Defaults Defaults
	Limits   Limits
	// StoppedRetention is how long a stopped sandbox's record and writable
	// layer are kept before they are deleted.
	StoppedRetention time.Duration
	// ReapInterval is how often TTLs are checked.
	ReapInterval time.Duration
	Logger       *slog.Logger
	// Events receives the sandboxes' lifecycle events (nil: none kept).
	Events *events.Log
	// Metrics records operation latencies and event counts (nil: none).
	Metrics *metrics.Metrics
	// StatsInterval is how often each sandbox's figures are sampled.
	StatsInterval time.Duration

	// Swap: the node has a swap area (corral serve --swap), where a
	// container sandbox's memory goes when it is paused with reclaim.
	Swap bool

	// Admit, when set, decides on every create against the live and
	// in-flight sandboxes of the node (quota admission); see reserve.
	Admit AdmitFunc

	// PerProjectLayerMounts mounts each project's layers apart
	// (image.MountScope), so that sandboxes of different projects share
	// no layer's page cache.
	PerProjectLayerMounts bool

	// WarmPool is how many container sandboxes the node keeps made ahead
	// of demand per image, for creates with the default resources and no
	// network (warm.go); 0: none.
	WarmPool int
	// Recycle is how many deleted container sandboxes with network none
	// the node keeps per image, scrubbed (recyclable sandboxes), for the
	// next creates of the same project asking for the same resources
	// (warm.go); 0: none, every delete tears its sandbox down.
	Recycle int
	// BoundRecyclable holds each image's recyclable sandboxes, in use or
	// pooled, to Recycle; beyond it creates make plain ones. For a node
	// whose plain sandboxes cost less held idle than recyclable ones (with
	// the init stub, 1 host PID against corral-init's 7), so that a node
	// that holds thousands idle still recycles the few it cycles.
	BoundRecyclable bool

	// Snapshots bound the snapshots the node keeps (snapshotlimit.go).
	Snapshots SnapshotLimits
}

// Node is one machine's sandbox manager.
type Node struct {
	id       string
	cfg      Config
	db       *state.DB
	backends map[string]backend.Backend
	log      *slog.Logger

	mu        sync.Mutex
	sandboxes map[string]*entry

	// admitMu serialises Admit decisions; pending are the creates
	// admitted but not yet in sandboxes.
	admitMu sync.Mutex
	pending map[*state.Record]state.Record

	faultMu     sync.Mutex
	layerFaults map[string]string // layer digest -> why its data cannot be read

	procs processTable // long-running processes (StartProcess)

	execLog *execlog.Log // commands that carried an idempotency key
	snaps   snapshots    // completed snapshots (snapshot.go)
	keyed   keyedExecs   // those of them still running

	// closing is closed when Close begins, ending the waits of background
	// teardowns between retries.
	closing chan struct{}
	// inTeardown are the background halves of Deletes (teardown) in
	// flight, each channel closed when its teardown is over (Settle, Close).
	teardownMu sync.Mutex
	inTeardown map[string]chan struct{}
	warm       *warmPools

	stopReaper context.CancelFunc
	reaperDone chan struct{}

	samplerDone chan struct{} // closed when the stats sampler ends
}

// New opens the node's state, re-attaches to sandboxes that survived a
// restart, cleans up everything else it finds, and starts the TTL reaper.
func New(ctx context.Context, cfg Config) (*Node, error) {
	cfg.Defaults = cfg.Defaults.withFallbacks()
	cfg.Limits = cfg.Limits.withFallbacks()
	if cfg.StoppedRetention == 0 {
		cfg.StoppedRetention = time.Hour
	}
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = time.Second
	}
	if cfg.StatsInterval == 0 {
		cfg.StatsInterval = defaultStatsInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	db := cfg.State
	if db == nil {
		var err error
		if db, err = state.Open(StatePath(cfg.DataDir)); err != nil {
			return nil, err
		}
	}
	id, err := db.NodeID()
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("node id: %w", err)
	}
	n := &Node{
		id:        id,
		cfg:       cfg,
		db:        db,
		backends:  map[string]backend.Backend{},
		log:       cfg.Logger.With("node", id),
		sandboxes: map[string]*entry{},
		pending:   map[*state.Record]state.Record{},
		closing:   make(chan struct{}),

		layerFaults: map[string]string{},
	}
	for _, b := range cfg.Backends {
		n.backends[b.Name()] = b
	}
	if n.execLog, err = execlog.Open(ExecLogPath(cfg.DataDir)); err != nil {
		db.Close()
		return nil, err
	}
	err = n.recover(ctx)
	if err == nil {
		err = n.recoverExecLog()
	}
	if err == nil {
		err = n.loadSnapshots()
	}
	if err != nil {
		n.execLog.Close()
		db.Close()
		return nil, fmt.Errorf("recover node %s: %w", id, err)
	}
	n.dropFences(ctx)
	n.warm = newWarmPools(n, cfg.WarmPool, cfg.Recycle)
	reapCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	n.stopReaper = cancel
	n.reaperDone = make(chan struct{})
	go paced(reapCtx, n.cfg.ReapInterval, 1, n.reaperDone, func() { n.reapOnce(reapCtx, time.Now()) })
	n.samplerDone = make(chan struct{})
	go paced(reapCtx, n.cfg.StatsInterval, samplerShare, n.samplerDone, func() { n.sampleAll(reapCtx) })
	return n, nil
}

// StatePath is where the state database of the node with data dir dataDir
// lives.
func StatePath(dataDir string) string { return filepath.Join(dataDir, "state.db") }

// ID is the node's id; every sandbox id it makes starts with it.
func (n *Node) ID() string { return n.id }

// Close stops the reaper and closes the state database. Sandboxes keep
// running: the next New re-attaches to them.
func (n *Node) Close() error {
	select {
	case <-n.closing:
	default:
		close(n.closing)
	}
	n.warm.close()
	_ = n.Settle(context.Background())
	n.stopReaper()
	<-n.reaperDone
	<-n.samplerDone
	return errors.Join(n.execLog.Close(), n.db.Close())
}

// Shutdown deletes every sandbox, then closes the node. Used by
// `corral serve --cleanup-on-exit` and by tests.
func (n *Node) Shutdown(ctx context.Context) error {
	n.log.Info("deleting every sandbox before exit", "count", len(n.ids()))
	if n.warm != nil {
		n.warm.draining.Store(true)
	}
	// Deletes mostly wait (processes to die, cgroups to go): a few at
	// once end a node of hundreds in seconds rather than minutes.
	var (
		mu   sync.Mutex
		errs []error
	)
	ids := n.ids()
	inParallel(len(ids), func(i int) {
		if _, err := n.Delete(ctx, ids[i]); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	})
	return errors.Join(append(errs, n.Close())...)
}

func (n *Node) ids() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	ids := make([]string, 0, len(n.sandboxes))
	for id := range n.sandboxes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (n *Node) backendNames() string {
	names := make([]string, 0, len(n.backends))
	for name := range n.backends {
		names = append(names, name)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// recover walks the records of the previous run: sandboxes whose processes
// survived are re-attached, half-created ones are removed, lost ones are
// marked stopped; then each backend sweeps what no record describes.
func (n *Node) recover(ctx context.Context) error {
	recs, err := n.db.All()
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, rec := range recs {
		known[rec.BackendName()] = true
		n.recoverOne(ctx, rec)
	}
	for name, b := range n.backends {
		if err := b.Sweep(ctx, func(id string) bool { return known[id] }); err != nil {
			return fmt.Errorf("sweep %s leftovers: %w", name, err)
		}
	}
	return nil
}

func (n *Node) recoverOne(ctx context.Context, rec *state.Record) {
	log := n.log.With("sandbox", rec.ID, "project", projectOf(rec))
	b, ok := n.backends[rec.Backend]
	if !ok {
		log.Warn("record of a backend this node no longer runs; keeping it", "backend", rec.Backend)
		return
	}
	e := &entry{rec: rec, backend: b, deleted: make(chan struct{})}
	if rec.Deleting {
		log.Info("finishing the teardown of a deleted sandbox")
		if err := b.Cleanup(ctx, rec.BackendName(), rec.BackendRecord); err != nil {
			log.Error("teardown of deleted sandbox", "err", err)
			return
		}
		n.forget(rec)
		return
	}
	if rec.Phase != state.PhaseCreating {
		n.cfg.Images.Pin(rec.ID, imageLayers(rec.Layers))
	}
	switch rec.Phase {
	case state.PhaseCreating:
		log.Info("removing sandbox whose creation was interrupted")
		if err := b.Cleanup(ctx, rec.BackendName(), rec.BackendRecord); err != nil {
			log.Error("cleanup interrupted create", "err", err)
			return
		}
		if err := n.db.Delete(rec.ID); err != nil {
			log.Error("delete record", "err", err)
		}
		return
	case state.PhaseRunning, state.PhasePaused:
		sb, err := b.Recover(ctx, rec.BackendName(), rec.BackendRecord)
		if err != nil {
			log.Warn("sandbox did not survive the restart", "err", err)
			if err := b.Cleanup(ctx, rec.BackendName(), rec.BackendRecord); err != nil {
				log.Error("cleanup lost sandbox", "err", err)
			}
			e.markStopped(fmt.Sprintf("lost at daemon restart: %v", err))
			n.persist(e)
			lost := e.snapshot()
			n.emit(lost, events.Stopped, lost.StopReason, nil)
			break
		}
		if rec.Phase == state.PhasePaused {
			if err := sb.Pause(ctx); err != nil {
				log.Warn("re-pause recovered sandbox; it stays running", "err", err)
				rec.Phase = state.PhaseRunning
				e.sb = sb
				n.persist(e)
			}
		}
		e.sb, e.recyclable = sb, isRecyclable(sb)
		log.Info("re-attached sandbox", "phase", rec.Phase)
	}
	e.touch()
	n.mu.Lock()
	n.sandboxes[rec.ID] = e
	n.mu.Unlock()
	if e.sb != nil {
		go n.watch(e, e.sb)
	}
}

// persist writes e's record; a failure is logged, not returned, because the
// sandbox itself is fine and the sweep at the next start covers a lost record.
func (n *Node) persist(e *entry) {
	rec := e.snapshot()
	if err := n.db.Put(rec); err != nil {
		n.log.Error("persist sandbox record", "sandbox", rec.ID, "err", err)
	}
}

// watch marks a sandbox stopped when its processes die on their own; it
// ends when Delete takes the sandbox away.
func (n *Node) watch(e *entry, sb backend.Sandbox) {
	select {
	case <-sb.Done():
	case <-e.deleted:
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reason := "sandbox init exited"
	if r, ok := sb.(backend.ExitReasoner); ok && r.ExitReason() != "" {
		reason = r.ExitReason()
	}
	n.stop(ctx, e, sb, events.Stopped, reason)
}
