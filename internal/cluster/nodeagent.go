package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// AgentConfig configures a node's side of the cluster.
type AgentConfig struct {
	// Sandboxes is the node's own SandboxService (it serves only this
	// node's sandboxes).
	Sandboxes corralv1connect.SandboxServiceHandler
	// Capacity is what the node admits at most.
	Capacity Capacity
	// DefaultCPUMillis and DefaultMemoryBytes are the node's defaults for
	// a create that names none.
	DefaultCPUMillis, DefaultMemoryBytes int64
	// Prepare, when set, runs before an admitted create (the node fetches
	// an image another node made).
	Prepare func(ctx context.Context, req *corralv1.CreateRequest) error
	// RecountInterval is how often Measure lists every sandbox of the
	// node (default 10s); in between it adds up the creates and deletes
	// the agent served. The recount catches what the agent did not see:
	// sandboxes that stopped by themselves, or were made or deleted on
	// the node's own socket.
	RecountInterval time.Duration
	Logger          *slog.Logger
}

// NodeAgent is the node's edge towards control instances: it has the final
// say on admission (against Capacity, counting creates in progress), and
// it dedupes creates by their client request id, so that a retried create
// returns the sandbox the first attempt made. It measures the node's load
// for the Registrar.
type NodeAgent struct {
	corralv1connect.SandboxServiceHandler
	cfg AgentConfig

	mu sync.Mutex
	// measured is the committed load at the last recount; delta what this
	// agent made or deleted since (backends and labels included);
	// inflight the creates in progress.
	measured, delta, inflight Load
	recounted                 time.Time
	pending                   map[string]*pendingCreate // request id -> create in progress
	done                      map[string]made           // request id -> its sandbox
	// listed is every sandbox at the last recount; listedGen changes
	// when the set does (see Summary).
	listed    []*corralv1.Sandbox
	listedFP  uint64
	listedGen uint64
}

type made struct {
	id string
	at time.Time
}

type pendingCreate struct {
	finished chan struct{}
	resp     *connect.Response[corralv1.CreateResponse]
	err      error
}

// NewNodeAgent builds the agent and rebuilds its request-id index from the
// node's sandboxes (labelled with their request id).
func NewNodeAgent(ctx context.Context, cfg AgentConfig) (*NodeAgent, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RecountInterval <= 0 {
		cfg.RecountInterval = 10 * time.Second
	}
	a := &NodeAgent{SandboxServiceHandler: cfg.Sandboxes, cfg: cfg, pending: map[string]*pendingCreate{}, done: map[string]made{}}
	if _, err := a.Measure(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// Handler serves the agent's SandboxService for control instances: only
// calls signed with the cluster secret.
func (a *NodeAgent) Handler(secret Secret, opts ...connect.HandlerOption) (string, http.Handler) {
	path, h := corralv1connect.NewSandboxServiceHandler(a, opts...)
	return path, RequireSigned(secret, h)
}

// Measure returns the node's committed load (creates in progress
// included): the last recount plus what the agent served since, recounted
// first when RecountInterval has passed.
func (a *NodeAgent) Measure(ctx context.Context) (Load, error) {
	a.mu.Lock()
	due := time.Since(a.recounted) >= a.cfg.RecountInterval
	a.mu.Unlock()
	if due {
		return a.recount(ctx)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.currentLocked(), nil
}

// currentLocked is measured + delta + inflight, with its own maps.
func (a *NodeAgent) currentLocked() Load {
	out := a.measured
	out.add(a.delta, 1)
	out.add(a.inflight, 1)
	out.Backends = positive(sumCounts(a.measured.Backends, a.delta.Backends))
	out.Labels = topCounts(positive(sumCounts(a.measured.Labels, a.delta.Labels)), maxLabelCounts)
	out.Projects = sumUsage(a.measured.Projects, a.delta.Projects, 1)
	for k, u := range out.Projects {
		if u.Sandboxes <= 0 { // deleted here, not counted by the last recount
			delete(out.Projects, k)
		}
	}
	return out
}

// sumCounts is a + b without the zero counts, in a new map.
func sumCounts(a, b map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(a)+len(b))
	for k, n := range a {
		out[k] = n
	}
	for k, n := range b {
		if out[k] += n; out[k] == 0 {
			delete(out, k)
		}
	}
	return out
}

// positive drops the counts below one (a sandbox the agent saw deleted
// that the last recount had not counted).
func positive(m map[string]int64) map[string]int64 {
	for k, n := range m {
		if n <= 0 {
			delete(m, k)
		}
	}
	return m
}

// count adds sign to the backend and label counts of a sandbox.
func (l *Load) count(backend string, labels map[string]string, sign int64) {
	if l.Backends == nil {
		l.Backends = map[string]int64{}
	}
	if backend == "" {
		backend = "container"
	}
	l.Backends[backend] += sign
	for k, v := range labels {
		if k == RequestIDLabel {
			continue
		}
		if l.Labels == nil {
			l.Labels = map[string]int64{}
		}
		l.Labels[k+"="+v] += sign
	}
}

// countProject adds sign × sb's usage to its project's.
func (l *Load) countProject(sb *corralv1.Sandbox, sign int64) {
	if sb.GetProject() == "" {
		return
	}
	u := usageOf(sb)
	if sign < 0 {
		u = neg(u)
	}
	if l.Projects == nil {
		l.Projects = map[string]iam.Usage{}
	}
	l.Projects[sb.Project] = l.Projects[sb.Project].Add(u)
}

// recount lists the node's sandboxes and returns its committed load; it
// also refreshes the request-id index. What the agent served while the
// list was taken stays in delta: counted twice at worst until the next
// recount, never missed.
// Recount lists every sandbox of the node now, as Measure does when its
// RecountInterval has passed, for when the caller knows the table changed
// behind the agent.
func (a *NodeAgent) Recount(ctx context.Context) (Load, error) { return a.recount(ctx) }

func (a *NodeAgent) recount(ctx context.Context) (Load, error) {
	a.mu.Lock()
	start, before := time.Now(), a.delta.clone()
	a.mu.Unlock()
	l := Load{Backends: map[string]int64{}}
	labels := map[string]int64{}
	projects := map[string]iam.Usage{}
	ids := map[string]made{}
	var all []*corralv1.Sandbox
	tok := ""
	for {
		resp, err := a.SandboxServiceHandler.List(ctx, connect.NewRequest(&corralv1.ListRequest{PageSize: 1000, PageToken: tok}))
		if err != nil {
			return Load{}, fmt.Errorf("measure node load: %w", err)
		}
		all = append(all, resp.Msg.Sandboxes...)
		for _, sb := range resp.Msg.Sandboxes {
			if rid := sb.Labels[RequestIDLabel]; rid != "" {
				ids[rid] = made{id: sb.Id}
			}
			if sb.State == corralv1.SandboxState_SANDBOX_STATE_STOPPED {
				continue
			}
			l.Sandboxes++
			l.CPUMillis += sb.GetResources().GetCpuMillis()
			l.MemoryBytes += sb.GetResources().GetMemoryBytes()
			l.Backends[sb.Backend]++
			if sb.Project != "" {
				projects[sb.Project] = projects[sb.Project].Add(usageOf(sb))
			}
			for k, v := range sb.Labels {
				if k != RequestIDLabel {
					labels[k+"="+v]++
				}
			}
		}
		if tok = resp.Msg.NextPageToken; tok == "" {
			break
		}
	}
	l.Labels = topCounts(labels, maxLabelCounts)
	if len(projects) > 0 {
		l.Projects = projects
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// Sandboxes made while listing may be missing from the list: keep them.
	for rid, m := range a.done {
		if m.at.After(start) {
			ids[rid] = m
		}
	}
	a.done = ids
	a.delta.add(before, -1)
	a.delta.Backends = sumCounts(a.delta.Backends, negate(before.Backends))
	a.delta.Labels = sumCounts(a.delta.Labels, negate(before.Labels))
	a.delta.Projects = sumUsage(a.delta.Projects, before.Projects, -1)
	a.measured, a.recounted = l, start
	if fp := fingerprint(all); fp != a.listedFP || a.listedGen == 0 {
		a.listedFP = fp
		a.listedGen++
	}
	a.listed = all
	return a.currentLocked(), nil
}

// clone is l with its own maps.
func (l Load) clone() Load {
	l.Backends, l.Labels = sumCounts(l.Backends, nil), sumCounts(l.Labels, nil)
	l.Projects = sumUsage(l.Projects, nil, 1)
	return l
}

// sumUsage is a + sign × b per project, in a new map (nil when empty).
func sumUsage(a, b map[string]iam.Usage, sign int64) map[string]iam.Usage {
	out := make(map[string]iam.Usage, len(a)+len(b))
	for k, u := range a {
		out[k] = u
	}
	for k, u := range b {
		if sign < 0 {
			u = neg(u)
		}
		out[k] = out[k].Add(u)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func negate(m map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, n := range m {
		out[k] = -n
	}
	return out
}

// Summary is the node's sandboxes at the last recount, and a generation
// that changes whenever that set does (the Registrar rewrites the node's
// summary in etcd only then).
func (a *NodeAgent) Summary() (uint64, []*corralv1.Sandbox) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.listedGen, a.listed
}

func (a *NodeAgent) cost(m *corralv1.CreateRequest) Load {
	l := Load{Sandboxes: 1, CPUMillis: m.GetResources().GetCpuMillis(), MemoryBytes: m.GetResources().GetMemoryBytes()}
	if l.CPUMillis == 0 {
		l.CPUMillis = a.cfg.DefaultCPUMillis
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = a.cfg.DefaultMemoryBytes
	}
	return l
}

// admitLocked refuses a create that would take the node past its
// capacity, naming what ran out.
func (a *NodeAgent) admitLocked(c Load) error {
	now := a.measured
	now.add(a.delta, 1)
	now.add(a.inflight, 1)
	capa := a.cfg.Capacity
	check := func(what string, used, want, total int64) error {
		if total > 0 && used+want > total {
			return errdefs.ResourceExhausted("node admission: %s: %d committed of %d, %d asked", what, used, total, want)
		}
		return nil
	}
	if err := check("sandboxes", now.Sandboxes, c.Sandboxes, capa.Sandboxes); err != nil {
		return err
	}
	if err := check("cpu_millis", now.CPUMillis, c.CPUMillis, capa.CPUMillis); err != nil {
		return err
	}
	return check("memory_bytes", now.MemoryBytes, c.MemoryBytes, capa.MemoryBytes)
}

// Create admits the create, or refuses it with ResourceExhausted; a
// request id seen before returns the sandbox made for it.
func (a *NodeAgent) Create(ctx context.Context, req *connect.Request[corralv1.CreateRequest]) (*connect.Response[corralv1.CreateResponse], error) {
	rid := req.Msg.GetPlacement().GetRequestId()
	cost := a.cost(req.Msg)
	a.mu.Lock()
	if rid != "" {
		if m, ok := a.done[rid]; ok {
			a.mu.Unlock()
			return a.existing(ctx, rid, m.id)
		}
		if p, ok := a.pending[rid]; ok {
			a.mu.Unlock()
			select {
			case <-p.finished:
				return p.resp, p.err
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	if err := a.admitLocked(cost); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	a.inflight.add(cost, 1)
	p := &pendingCreate{finished: make(chan struct{})}
	if rid != "" {
		a.pending[rid] = p
		if req.Msg.Labels == nil {
			req.Msg.Labels = map[string]string{}
		}
		req.Msg.Labels[RequestIDLabel] = rid
	}
	a.mu.Unlock()

	// The create finishes even if the control instance that sent it goes
	// away: a retry then finds its sandbox instead of making another.
	cctx := context.WithoutCancel(ctx)
	if a.cfg.Prepare != nil {
		p.err = a.cfg.Prepare(cctx, req.Msg)
	}
	if p.err == nil {
		p.resp, p.err = a.SandboxServiceHandler.Create(cctx, req)
	}
	a.mu.Lock()
	a.inflight.add(cost, -1)
	if p.err == nil {
		a.countMadeLocked(cost, p.resp.Msg.GetSandbox())
	}
	if rid != "" {
		delete(a.pending, rid)
		if p.err == nil {
			a.done[rid] = made{id: p.resp.Msg.Sandbox.Id, at: time.Now()}
		}
	}
	a.mu.Unlock()
	close(p.finished)
	return p.resp, p.err
}

func (a *NodeAgent) existing(ctx context.Context, rid, id string) (*connect.Response[corralv1.CreateResponse], error) {
	got, err := a.SandboxServiceHandler.Get(ctx, connect.NewRequest(&corralv1.GetRequest{Id: id}))
	if errdefs.IsNotFound(err) || connect.CodeOf(err) == connect.CodeNotFound {
		return nil, errdefs.FailedPrecondition("request %s made sandbox %s, which has since been deleted", rid, id)
	}
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.CreateResponse{Sandbox: got.Msg.Sandbox}), nil
}

// List waits for a create in progress when asked for its request id, so
// that a control instance looking for an earlier attempt finds it.
func (a *NodeAgent) List(ctx context.Context, req *connect.Request[corralv1.ListRequest]) (*connect.Response[corralv1.ListResponse], error) {
	if rid := req.Msg.Labels[RequestIDLabel]; rid != "" {
		a.mu.Lock()
		p := a.pending[rid]
		a.mu.Unlock()
		if p != nil {
			select {
			case <-p.finished:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return a.SandboxServiceHandler.List(ctx, req)
}

// Delete frees the sandbox's share of the capacity at once (the next
// Measure confirms it).
func (a *NodeAgent) Delete(ctx context.Context, req *connect.Request[corralv1.DeleteRequest]) (*connect.Response[corralv1.DeleteResponse], error) {
	got, gerr := a.SandboxServiceHandler.Get(ctx, connect.NewRequest(&corralv1.GetRequest{Id: req.Msg.Id}))
	resp, err := a.SandboxServiceHandler.Delete(ctx, req)
	if err == nil && gerr == nil && resp.Msg.Existed && got.Msg.Sandbox.State != corralv1.SandboxState_SANDBOX_STATE_STOPPED {
		sb := got.Msg.Sandbox
		a.mu.Lock()
		a.delta.add(Load{Sandboxes: 1, CPUMillis: sb.GetResources().GetCpuMillis(), MemoryBytes: sb.GetResources().GetMemoryBytes()}, -1)
		a.delta.count(sb.Backend, sb.Labels, -1)
		a.delta.countProject(sb, -1)
		a.mu.Unlock()
		if sb.Project != "" {
			// The control instance credits the project at once.
			resp.Header().Set(freedHeader, marshal(freed{Project: sb.Project, Usage: usageOf(sb)}))
		}
	}
	return resp, err
}

// freedHeader on a Delete's answer says what the deleted sandbox's project
// got back.
const freedHeader = "Corral-Cluster-Freed"

type freed struct {
	Project string    `json:"project"`
	Usage   iam.Usage `json:"usage"`
}

func decodeFreed(h string) (freed, bool) {
	var f freed
	if h == "" || json.Unmarshal([]byte(h), &f) != nil || f.Project == "" {
		return f, false
	}
	return f, true
}

// usageOf is what sb counts against its project's quota.
func usageOf(sb *corralv1.Sandbox) iam.Usage {
	r := sb.GetResources()
	return iam.Usage{Sandboxes: 1, CPUMillis: r.GetCpuMillis(), MemoryBytes: r.GetMemoryBytes(), DiskBytes: r.GetDiskBytes()}
}

// topCounts keeps the n largest counts of m.
func topCounts(m map[string]int64, n int) map[string]int64 {
	if len(m) <= n {
		return m
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	out := make(map[string]int64, n)
	for _, k := range keys[:n] {
		out[k] = m[k]
	}
	return out
}
