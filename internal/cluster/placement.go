package cluster

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// Want is what a create asks of its node.
type Want struct {
	Backend     string
	CPUMillis   int64
	MemoryBytes int64
	NodeLabels  map[string]string
	BurstOK     bool
	// Spread is a "key=value" label: the candidate with the fewest
	// sandboxes carrying it wins (anti-affinity), every candidate compared.
	Spread string
	// Project is the create's project; Quotas its own quota and its
	// ancestors' (project first), set when one of them limits
	// concurrent use: the create is refused when it would take one past
	// its limit, counting usage over the whole cluster.
	Project   string
	Quotas    []ProjectQuota
	DiskBytes int64
}

// ProjectQuota is one project's quota.
type ProjectQuota struct {
	Path  string
	Quota iam.Quota
}

// PlacerConfig configures placement.
type PlacerConfig struct {
	// K is how many nodes are sampled per placement (power of k choices);
	// 0 or less scans every candidate (least loaded).
	K int
	// BurstThreshold is the primary pool's utilisation above which
	// burst-ok creates may go to the burst pool (default 0.8).
	BurstThreshold float64
	// DefaultCPUMillis and DefaultMemoryBytes estimate a create that names
	// no resources (the nodes' defaults).
	DefaultCPUMillis, DefaultMemoryBytes int64
}

// Placer picks nodes for creates: filter, then the least loaded of K
// random candidates. Its estimate of a node's load is the watcher's
// snapshot plus this control instance's own placements the node has not
// reported yet (in flight, or answered after the node's last report).
type Placer struct {
	cfg PlacerConfig
	w   func() *Snapshot

	mu      sync.Mutex
	overlay map[string]*overlay
	// filtered is the last plain filter's outcome (candidates are shared,
	// never modified).
	filtered atomic.Pointer[filtered]
}

type overlay struct {
	inflight Load
	// inflightSpread counts in-flight placements per spread label.
	inflightSpread map[string]int64
	// inflightProjects is what in-flight placements use per project.
	inflightProjects map[string]iam.Usage
	recent           []placed
}

// placed is a create answered by the node (or, with negative res and
// usage, a delete) that the node's report may not cover yet.
type placed struct {
	at      time.Time
	res     Load
	spread  string
	project string
	usage   iam.Usage
}

// NewPlacer places on the nodes of snapshot().
func NewPlacer(cfg PlacerConfig, snapshot func() *Snapshot) *Placer {
	if cfg.BurstThreshold == 0 {
		cfg.BurstThreshold = 0.8
	}
	if cfg.DefaultCPUMillis == 0 {
		cfg.DefaultCPUMillis = 1000
	}
	if cfg.DefaultMemoryBytes == 0 {
		cfg.DefaultMemoryBytes = 512 << 20
	}
	return &Placer{cfg: cfg, w: snapshot, overlay: map[string]*overlay{}}
}

func (p *Placer) cost(w Want) Load {
	l := Load{Sandboxes: 1, CPUMillis: w.CPUMillis, MemoryBytes: w.MemoryBytes}
	if l.CPUMillis == 0 {
		l.CPUMillis = p.cfg.DefaultCPUMillis
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = p.cfg.DefaultMemoryBytes
	}
	return l
}

func (l *Load) add(o Load, sign int64) {
	l.Sandboxes += sign * o.Sandboxes
	l.CPUMillis += sign * o.CPUMillis
	l.MemoryBytes += sign * o.MemoryBytes
}

// estimateLocked is v's load with this instance's unreported placements.
func (p *Placer) estimateLocked(v *NodeView) Load {
	l := v.Load
	o := p.overlay[v.ID]
	if o == nil {
		return l
	}
	l.add(o.inflight, 1)
	keep := o.recent[:0]
	for _, r := range o.recent {
		if r.at.After(v.AsOf) {
			keep = append(keep, r)
			l.add(r.res, 1)
		}
	}
	o.recent = keep
	return l
}

// Placement is one chosen node; Done must be called with the node's answer.
type Placement struct {
	Node    *NodeView
	p       *Placer
	cost    Load
	spread  string
	project string
	usage   iam.Usage
}

// Done records the outcome: an admitted create stays in the overlay until
// the node reports a load measured after it.
func (pl *Placement) Done(admitted bool) {
	p := pl.p
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.overlay[pl.Node.ID]
	o.inflight.add(pl.cost, -1)
	if pl.spread != "" {
		o.inflightSpread[pl.spread]--
	}
	if pl.project != "" {
		o.inflightProjects[pl.project] = o.inflightProjects[pl.project].Add(neg(pl.usage))
	}
	if admitted {
		o.recent = append(o.recent, placed{at: time.Now(), res: pl.cost, spread: pl.spread, project: pl.project, usage: pl.usage})
	}
}

func neg(u iam.Usage) iam.Usage {
	return iam.Usage{Sandboxes: -u.Sandboxes, CPUMillis: -u.CPUMillis, MemoryBytes: -u.MemoryBytes, DiskBytes: -u.DiskBytes}
}

// Freed tells the placer that node gave back what a deleted sandbox of
// project used, so a create right after the delete is not refused on the
// node's older report.
func (p *Placer) Freed(node, project string, u iam.Usage) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.overlayLocked(node)
	res := Load{Sandboxes: -u.Sandboxes, CPUMillis: -u.CPUMillis, MemoryBytes: -u.MemoryBytes}
	o.recent = append(o.recent, placed{at: time.Now(), res: res, project: project, usage: neg(u)})
}

func (p *Placer) overlayLocked(node string) *overlay {
	o := p.overlay[node]
	if o == nil {
		o = &overlay{inflightSpread: map[string]int64{}, inflightProjects: map[string]iam.Usage{}}
		p.overlay[node] = o
	}
	return o
}

// projectUsageLocked is what path and its subprojects use over the
// cluster's live nodes: their reports plus this instance's placements and
// deletes that the reports do not cover yet. A lost node's sandboxes do
// not count (they may never come back).
func (p *Placer) projectUsageLocked(snap *Snapshot, path string) iam.Usage {
	var u iam.Usage
	for _, v := range snap.Nodes {
		if v.State == NodeLost {
			continue
		}
		for proj, pu := range v.Load.Projects {
			if iam.Within(proj, path) {
				u = u.Add(pu)
			}
		}
		o := p.overlay[v.ID]
		if o == nil {
			continue
		}
		for proj, pu := range o.inflightProjects {
			if iam.Within(proj, path) {
				u = u.Add(pu)
			}
		}
		for _, r := range o.recent {
			if r.project != "" && r.at.After(v.AsOf) && iam.Within(r.project, path) {
				u = u.Add(r.usage)
			}
		}
	}
	return u
}

// admitQuotaLocked refuses w when it would take its project, or an
// ancestor, past a quota counted over the cluster.
func (p *Placer) admitQuotaLocked(snap *Snapshot, w Want, cost Load) error {
	want := iam.Usage{Sandboxes: 1, CPUMillis: cost.CPUMillis, MemoryBytes: cost.MemoryBytes, DiskBytes: w.DiskBytes}
	for _, q := range w.Quotas {
		if !q.Quota.Limits() {
			continue
		}
		if err := iam.CheckUsage(q.Path, q.Quota, p.projectUsageLocked(snap, q.Path), want); err != nil {
			return fmt.Errorf("placement: %w (counted over the cluster's nodes)", err)
		}
	}
	return nil
}

// Place picks a node for w, skipping the nodes in exclude (ids that
// refused this create already, with why). The error lists why each node
// was passed over.
func (p *Placer) Place(w Want, exclude map[string]string) (*Placement, error) {
	snap := p.w()
	cost := p.cost(w)
	primary, burst, why := p.filter(snap, w, exclude)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.admitQuotaLocked(snap, w, cost); err != nil {
		return nil, err
	}
	cands := primary
	if len(burst) > 0 {
		switch u := p.primaryUtilisationLocked(snap); {
		case !w.BurstOK:
			for _, v := range burst {
				why[v.ID] = "burst pool: the create does not allow it (burst_ok)"
			}
		case u <= p.cfg.BurstThreshold:
			for _, v := range burst {
				why[v.ID] = fmt.Sprintf("burst pool: primary utilisation %.0f%% is not above %.0f%%", 100*u, 100*p.cfg.BurstThreshold)
			}
		default:
			cands = append(cands[:len(cands):len(cands)], burst...)
		}
	}
	var best *NodeView
	if w.Spread != "" {
		best = p.spreadLocked(cands, cost, w.Spread)
	} else {
		best = p.chooseLocked(cands, cost)
	}
	if best == nil {
		for _, v := range cands {
			why[v.ID] = fmt.Sprintf("full: utilisation %.0f%%", 100*p.estimateLocked(v).Utilisation(v.Capacity))
		}
		return nil, noNode(why)
	}
	o := p.overlayLocked(best.ID)
	o.inflight.add(cost, 1)
	if w.Spread != "" {
		o.inflightSpread[w.Spread]++
	}
	pl := &Placement{Node: best, p: p, cost: cost, spread: w.Spread}
	if len(w.Quotas) > 0 {
		pl.project = w.Project
		pl.usage = iam.Usage{Sandboxes: 1, CPUMillis: cost.CPUMillis, MemoryBytes: cost.MemoryBytes, DiskBytes: w.DiskBytes}
		o.inflightProjects[w.Project] = o.inflightProjects[w.Project].Add(pl.usage)
	}
	return pl, nil
}

// filtered is the outcome of the filter for one snapshot and backend,
// with no node labels asked and no node excluded (most creates).
type filtered struct {
	snap           *Snapshot
	backend        string
	primary, burst []*NodeView
	why            map[string]string
}

// filter splits the nodes that can take w into the primary and the burst
// pool, and says why each other node cannot. The common case is
// remembered for the snapshot, so that a create does not test every node
// again until a report changes the snapshot.
func (p *Placer) filter(snap *Snapshot, w Want, exclude map[string]string) (primary, burst []*NodeView, why map[string]string) {
	plain := len(exclude) == 0 && len(w.NodeLabels) == 0
	if f := p.filtered.Load(); plain && f != nil && f.snap == snap && f.backend == w.Backend {
		return f.primary, f.burst, maps.Clone(f.why)
	}
	primary = make([]*NodeView, 0, len(snap.Nodes))
	why = map[string]string{}
	for _, v := range snap.Nodes {
		if r, ok := exclude[v.ID]; ok {
			why[v.ID] = r
			continue
		}
		if r := p.unfit(v, w); r != "" {
			why[v.ID] = r
			continue
		}
		if v.burst {
			burst = append(burst, v)
		} else {
			primary = append(primary, v)
		}
	}
	if plain {
		p.filtered.Store(&filtered{snap: snap, backend: w.Backend, primary: primary, burst: burst, why: maps.Clone(why)})
	}
	return primary, burst, why
}

// spreadLocked compares every candidate that can take the create: the
// fewest sandboxes with label pair first, then the lowest utilisation.
func (p *Placer) spreadLocked(cands []*NodeView, cost Load, pair string) *NodeView {
	var best *NodeView
	var bestN int64
	bestU := 0.0
	for _, v := range cands {
		l := p.estimateLocked(v)
		l.add(cost, 1)
		u := l.Utilisation(v.Capacity)
		if u > 1 {
			continue
		}
		n := v.Load.Labels[pair]
		if o := p.overlay[v.ID]; o != nil {
			n += o.inflightSpread[pair]
			for _, r := range o.recent { // trimmed to those after AsOf above
				if r.spread == pair {
					n++
				}
			}
		}
		if best == nil || n < bestN || n == bestN && u < bestU {
			best, bestN, bestU = v, n, u
		}
	}
	return best
}

// chooseLocked samples K candidates (all with K <= 0) and returns the one
// whose utilisation after this create would be lowest.
func (p *Placer) chooseLocked(cands []*NodeView, cost Load) *NodeView {
	var best *NodeView
	bestU := 0.0
	try := func(v *NodeView) {
		l := p.estimateLocked(v)
		l.add(cost, 1)
		if l.Utilisation(v.Capacity) > 1 {
			return // would not be admitted: leave it out
		}
		if u := l.Utilisation(v.Capacity); best == nil || u < bestU {
			best, bestU = v, u
		}
	}
	n := len(cands)
	if p.cfg.K <= 0 || p.cfg.K >= n {
		for _, v := range cands {
			try(v)
		}
		return best
	}
	// K distinct indexes (Floyd's sampling); a full candidate is skipped
	// and another drawn, so a nearly full cluster still places.
	picked := make([]int, 0, p.cfg.K)
	for tries := 0; best == nil && tries < 4; tries++ {
		picked = picked[:0]
		for j := n - p.cfg.K; j < n; j++ {
			i := rand.IntN(j + 1)
			if slices.Contains(picked, i) {
				i = j
			}
			picked = append(picked, i)
			try(cands[i])
		}
	}
	if best == nil {
		for _, v := range cands {
			try(v)
		}
	}
	return best
}

// primaryUtilisationLocked is the committed fraction of the primary pool
// as a whole (ready nodes not in the burst pool).
func (p *Placer) primaryUtilisationLocked(snap *Snapshot) float64 {
	var used Load
	var capa Capacity
	for _, v := range snap.Nodes {
		if v.burst || v.State != NodeReady {
			continue
		}
		used.add(p.estimateLocked(v), 1)
		capa.Sandboxes += v.Capacity.Sandboxes
		capa.CPUMillis += v.Capacity.CPUMillis
		capa.MemoryBytes += v.Capacity.MemoryBytes
	}
	if capa == (Capacity{}) {
		return 1
	}
	return used.Utilisation(capa)
}

// unfit says why v cannot take w ("" when it can).
func (p *Placer) unfit(v *NodeView, w Want) string {
	switch v.State {
	case NodeLost:
		return "lost"
	case NodeDrained:
		return "drained"
	}
	backend := w.Backend
	if backend == "" {
		backend = "container"
	}
	found := false
	for _, b := range v.Backends {
		found = found || b == backend
	}
	if !found {
		return fmt.Sprintf("no %s backend (has %s)", backend, strings.Join(v.Backends, ", "))
	}
	for k, want := range w.NodeLabels {
		if got, ok := v.Labels[k]; !ok || got != want {
			return fmt.Sprintf("label %s=%s: node has %q", k, want, got)
		}
	}
	return ""
}

// noNode is the error of a create no node can take, naming each node's
// reason.
func noNode(why map[string]string) error {
	if len(why) == 0 {
		return errdefs.Unavailable("placement: the cluster has no nodes")
	}
	ids := make([]string, 0, len(why))
	for id := range why {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	parts := make([]string, 0, len(ids))
	for _, id := range ids {
		parts = append(parts, id+": "+why[id])
	}
	return errdefs.ResourceExhausted("placement: no node can take the sandbox (%s)", strings.Join(parts, "; "))
}

// Reserve counts up to n creates of w on node (forks, which must live
// where their parent is) as in flight, each admitted against the node's
// capacity and the project's quota over the cluster like a placement. It
// returns the placements admitted (each needs Done) and, when fewer than
// n, why the next one was refused.
func (p *Placer) Reserve(node string, w Want, n int) ([]*Placement, error) {
	snap := p.w()
	v := snap.Node(node)
	if v == nil {
		return nil, errdefs.NotFound("placement: no node %s in the cluster", node)
	}
	if r := p.unfit(v, w); r != "" {
		return nil, errdefs.FailedPrecondition("placement: node %s: %s", node, r)
	}
	cost := p.cost(w)
	usage := iam.Usage{Sandboxes: 1, CPUMillis: cost.CPUMillis, MemoryBytes: cost.MemoryBytes, DiskBytes: w.DiskBytes}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*Placement
	for range n {
		if err := p.admitQuotaLocked(snap, w, cost); err != nil {
			return out, err
		}
		l := p.estimateLocked(v)
		l.add(cost, 1)
		if u := l.Utilisation(v.Capacity); u > 1 {
			return out, errdefs.ResourceExhausted("placement: node %s is full (utilisation %.0f%% with this sandbox)", node, 100*u)
		}
		o := p.overlayLocked(node)
		o.inflight.add(cost, 1)
		pl := &Placement{Node: v, p: p, cost: cost}
		if len(w.Quotas) > 0 {
			pl.project, pl.usage = w.Project, usage
			o.inflightProjects[w.Project] = o.inflightProjects[w.Project].Add(usage)
		}
		out = append(out, pl)
	}
	return out, nil
}
