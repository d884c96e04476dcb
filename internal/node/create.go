package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/metrics"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/state"
	"github.com/corral-dev/corral/internal/storage/layers"
)

// knownBackends are every backend corral defines; a node runs a subset.
var knownBackends = []string{"container", "fncall", "microvm", "vm"}

// Resources are a sandbox's limits; zero fields take the node defaults.
type Resources struct {
	CPUMillis   int64
	MemoryBytes int64
	DiskBytes   int64
	Pids        int64
	BestEffort  bool // CPU only when others leave it idle
	IO          state.IOLimits
}

// CreateRequest asks for a new sandbox.
type CreateRequest struct {
	// Project is the IAM project the sandbox is made in ("": none).
	Project   string
	Backend   string
	Image     string
	Resources Resources
	Env       []string
	Workdir   string
	User      string
	Labels    map[string]string
	// nil takes the node default; 0 means never.
	IdleTimeout *time.Duration
	// nil takes the node default.
	MaxLifetime *time.Duration
	// Network is the policy; the zero value is mode none.
	Network backend.Network
	// IdleAction is what IdleTimeout does: "" or "stop", "pause", "reclaim".
	IdleAction string
	// Fresh: made from scratch and torn down by its delete, never from or
	// to a pool (see warmPools).
	Fresh bool

	// restoreFrom is the snapshot dir a Restore makes the sandbox from.
	restoreFrom string
	// keepID and createdAt, when set, are the id and creation time of a
	// migrated sandbox (AdoptSnapshot) instead of new ones.
	keepID    string
	createdAt time.Time
}

// Sandbox describes a sandbox to callers.
type Sandbox struct {
	state.Record
	NodeID       string
	LastActiveAt time.Time
	// Degraded says why a layer of the sandbox cannot be read ("": healthy).
	Degraded string
	// MigratingTo is the node a migration's fence holds it for ("": none).
	MigratingTo string
}

// NewID returns a fresh sandbox id for this node: "<node id>-<12 hex>".
func (n *Node) newID() (string, error) {
	buf := make([]byte, 6)
	if _, err := rand.Read(buf); err != nil {
		return "", err
	}
	return n.id + "-" + hex.EncodeToString(buf), nil
}

// NodeOf returns the node id encoded in a sandbox id.
func NodeOf(sandboxID string) (string, error) {
	nodeID, rest, ok := strings.Cut(sandboxID, "-")
	if !ok || nodeID == "" || rest == "" || len(sandboxID) > 128 {
		return "", errdefs.InvalidArgument("id: %q is not a sandbox id (want <node>-<hex>)", truncate(sandboxID))
	}
	return nodeID, nil
}

func (n *Node) checkID(id string) error {
	nodeID, err := NodeOf(id)
	if err != nil {
		return err
	}
	if nodeID != n.id && !n.Has(id) { // a sandbox migrated here keeps its id
		return errdefs.NotFound("sandbox %s belongs to node %s, not to this node (%s)", id, nodeID, n.id)
	}
	return nil
}

// Create validates req, fills in defaults and starts the sandbox.
func (n *Node) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	start := time.Now()
	rec, err := n.admit(req)
	if err != nil {
		return nil, err
	}
	b, err := n.pickBackend(rec.Backend)
	if err != nil {
		return nil, err
	}
	if req.restoreFrom == "" {
		if sb, ok, err := n.warm.handOut(ctx, rec, b, start); ok || err != nil {
			return sb, err
		}
	}
	if rec.ID, err = n.newID(); err != nil {
		return nil, fmt.Errorf("sandbox id: %w", err)
	}
	if req.keepID != "" {
		rec.ID, rec.CreatedAt = req.keepID, req.createdAt
	}
	if err := n.reserve(ctx, rec); err != nil {
		return nil, err
	}
	defer n.unreserve(rec)
	var img layers.Image
	// A backend with its own images (vm disks) resolves the name itself.
	if _, own := b.(backend.ImageOwner); !own {
		scope := ""
		if n.cfg.PerProjectLayerMounts {
			scope = layers.MountScope(rec.Project)
		}
		if img, err = n.cfg.Images.AcquireIn(ctx, rec.Image, rec.ID, scope); err != nil {
			return nil, fmt.Errorf("image: %w", err)
		}
	}
	rec.Env = mergeEnv(img.Env, rec.Env)
	rec.Layers = stateLayers(img.Stack)
	// The creating record goes first, so a crash mid-create is cleaned up at
	// the next start instead of leaking.
	if err := n.db.Put(rec); err != nil {
		n.cfg.Images.Release(rec.ID)
		return nil, fmt.Errorf("record sandbox %s: %w", rec.ID, err)
	}
	spec := specOf(rec, img)
	spec.Recyclable = n.warm.claim(rec)
	sb, err := makeSandbox(ctx, b, req, spec)
	if err != nil {
		if spec.Recyclable {
			n.warm.unclaim(rec.Image)
		}
		n.abandon(rec, b)
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	n.warm.made(rec)
	return n.started(rec, b, sb, start, false), nil
}

// specOf is the backend's spec of the sandbox rec describes, from img.
func specOf(rec *state.Record, img layers.Image) backend.Spec {
	return backend.Spec{
		ID:         rec.ID,
		Layers:     img.Layers,
		LayerDisks: img.Disks,
		Hostname:   "sandbox",
		Network:    backend.Network{Mode: rec.NetworkMode, Allow: rec.NetworkAllow},
		Image:      rec.Image,
		Resources: backend.Resources{
			CPUMillis:   rec.CPUMillis,
			MemoryBytes: rec.MemoryBytes,
			DiskBytes:   rec.DiskBytes,
			DiskInodes:  max(minDiskInodes, rec.DiskBytes/inodeBytesRate),
			Pids:        rec.Pids,
			BestEffort:  rec.BestEffort,
			IO:          backend.IOLimits(rec.IO),
		},
	}
}

// started records a running sandbox sb of rec and starts watching it.
func (n *Node) started(rec *state.Record, b backend.Backend, sb backend.Sandbox, start time.Time, warm bool) *Sandbox {
	rec.Phase = state.PhaseRunning
	rec.BackendRecord = sb.Record()
	e := &entry{rec: rec, backend: b, sb: sb, recyclable: isRecyclable(sb), deleted: make(chan struct{})}
	e.obs.primed = true // a new sandbox's counters start at zero
	e.touch()
	n.persist(e)
	n.mu.Lock()
	n.sandboxes[rec.ID] = e
	n.mu.Unlock()
	go n.watch(e, sb)
	took := time.Since(start)
	n.cfg.Metrics.ObserveOp(rec.Backend, metrics.OpCreate, took)
	n.emit(rec, events.Created, "image "+rec.Image, resourceFigures(rec))
	n.emit(rec, events.Started, "", map[string]float64{"create_seconds": took.Seconds()})
	n.log.Debug("sandbox created", "sandbox", rec.ID, "project", projectOf(rec), "image", rec.Image, "warm", warm, "took", took)
	return n.describe(e)
}

// abandon removes a sandbox whose backend create failed.
func (n *Node) abandon(rec *state.Record, b backend.Backend) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Cleanup(ctx, rec.ID, nil); err != nil {
		n.log.Error("cleanup after failed create", "sandbox", rec.ID, "err", err)
		return // keep the creating record: the next start retries
	}
	if err := n.db.Delete(rec.ID); err != nil {
		n.log.Error("delete record after failed create", "sandbox", rec.ID, "err", err)
	}
	n.cfg.Images.Release(rec.ID)
}

// stateLayers and imageLayers convert a stack between the image store's
// and the record's types.
func stateLayers(stack []layers.Layer) []state.Layer {
	out := make([]state.Layer, len(stack))
	for i, l := range stack {
		out[i] = state.Layer{Ref: l.Ref, Digest: l.Digest}
	}
	return out
}

func imageLayers(stack []state.Layer) []layers.Layer {
	out := make([]layers.Layer, len(stack))
	for i, l := range stack {
		out[i] = layers.Layer{Ref: l.Ref, Digest: l.Digest}
	}
	return out
}

func (n *Node) pickBackend(name string) (backend.Backend, error) {
	if b, ok := n.backends[name]; ok {
		return b, nil
	}
	for _, known := range knownBackends {
		if name == known {
			return nil, errdefs.NotSupported("backend: %q is not available on this node (available: %s)", name, n.backendNames())
		}
	}
	return nil, errdefs.InvalidArgument("backend: unknown backend %q (known: %s)", truncate(name), strings.Join(knownBackends, ", "))
}

// admit validates a request and returns the record it would create.
func (n *Node) admit(req CreateRequest) (*state.Record, error) {
	d, l := n.cfg.Defaults, n.cfg.Limits
	rec := &state.Record{
		Project:     req.Project,
		Backend:     or(req.Backend, d.Backend),
		Image:       or(req.Image, d.Image),
		Phase:       state.PhaseCreating,
		CPUMillis:   or(req.Resources.CPUMillis, d.CPUMillis),
		MemoryBytes: or(req.Resources.MemoryBytes, d.MemoryBytes),
		DiskBytes:   or(req.Resources.DiskBytes, d.DiskBytes),
		Pids:        or(req.Resources.Pids, d.Pids),
		BestEffort:  req.Resources.BestEffort,
		IO:          req.Resources.IO,
		Env:         req.Env,
		Workdir:     req.Workdir,
		User:        req.User,
		Labels:      req.Labels,
		NetworkMode: req.Network.Mode,
		IdleTimeout: d.IdleTimeout,
		MaxLifetime: d.MaxLifetime,
		CreatedAt:   time.Now(),
		IdleAction:  req.IdleAction,
		Fresh:       req.Fresh,
	}
	rec.NetworkAllow = req.Network.Allow
	if req.IdleTimeout != nil {
		rec.IdleTimeout = *req.IdleTimeout
	}
	if req.MaxLifetime != nil {
		rec.MaxLifetime = *req.MaxLifetime
	}
	checks := []error{
		checkRange("resources.cpu_millis", rec.CPUMillis, minCPUMillis, l.MaxCPUMillis, "m"),
		checkBytes("resources.memory_bytes", rec.MemoryBytes, minMemoryBytes, l.MaxMemoryBytes),
		checkBytes("resources.disk_bytes", rec.DiskBytes, minDiskBytes, l.MaxDiskBytes),
		checkRange("resources.pids", rec.Pids, minPids, l.MaxPids, ""),
		checkEnv("env", rec.Env),
		checkAbsPath("workdir", rec.Workdir),
		checkUser("user", rec.User),
		checkLabels(rec.Labels),
		checkDuration("idle_timeout", rec.IdleTimeout, l.MaxLifetime),
		checkDuration("max_lifetime", rec.MaxLifetime, l.MaxLifetime),
	}
	checks = append(checks, checkNetwork(req.Network), checkIO(rec.Backend, rec.IO, l.MaxIO), checkIdleAction(rec.IdleAction), n.checkReclaimable(rec))
	for _, err := range checks {
		if err != nil {
			return nil, err
		}
	}
	if rec.MaxLifetime == 0 {
		return nil, errdefs.InvalidArgument("max_lifetime: must be positive (at most %s)", l.MaxLifetime)
	}
	if !imageNamePattern.MatchString(rec.Image) {
		return nil, errdefs.InvalidArgument("image: %q is not a valid image name", truncate(rec.Image))
	}
	return rec, nil
}

func checkBytes(field string, v, lo, hi int64) error {
	if v < lo || v > hi {
		return errdefs.InvalidArgument("%s: %d is out of range (allowed %s to %s)", field, v, formatBytes(lo), formatBytes(hi))
	}
	return nil
}

func or[T comparable](v, fallback T) T {
	var zero T
	if v == zero {
		return fallback
	}
	return v
}

// mergeEnv returns base with overrides applied (later KEY= entries win).
func mergeEnv(base, overrides []string) []string {
	out := make([]string, 0, len(base)+len(overrides))
	index := map[string]int{}
	for _, kv := range append(append([]string(nil), base...), overrides...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := index[k]; ok {
			out[i] = kv
			continue
		}
		index[k] = len(out)
		out = append(out, kv)
	}
	return out
}

// checkNetwork checks the mode and the rules' syntax (netpolicy.Check, the
// one place of these rules); presets are the backend's to expand.
func checkNetwork(nw backend.Network) error {
	return netpolicy.Check(netpolicy.Policy{Mode: netpolicy.Mode(nw.Mode), Allow: nw.Allow})
}
