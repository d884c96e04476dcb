package node

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/state"
)

// Sizes of the per-sandbox rings: a few minutes of samples at the default
// interval, and the last few dozen execs.
const (
	defaultStatsInterval = 2 * time.Second
	statsRing            = 150
	execRing             = 32
)

// Sample is one reading of a sandbox's resource figures.
type Sample struct {
	Time        time.Time
	CPUPercent  float64 // since the previous sample; 100 = one core
	MemoryBytes int64
	DiskBytes   int64
	Pids        int64
	NetRxBytes  uint64
	NetTxBytes  uint64
}

// ExecRecord is one finished exec, for the dashboard.
type ExecRecord struct {
	Argv      []string
	StartedAt time.Time
	Result    backend.ExecResult
}

// observed is what the node keeps about a sandbox for observers: the
// sample and exec rings and the counters events are derived from.
type observed struct {
	mu           sync.Mutex
	samples      []Sample
	execs        []ExecRecord
	lastCPU      time.Duration
	primed       bool   // the counters below hold a first reading
	oomSeen      uint64 // OOM kills already reported
	refusals     uint64 // network refusals already reported
	checkpointed bool   // a checkpointed event was sent for the current pause
}

// SandboxStats are one sandbox's figures for the Stats call.
type SandboxStats struct {
	Record  *state.Record
	Project string
	Current Sample
	History []Sample
	Execs   []ExecRecord
}

// projectOf is the IAM project a sandbox belongs to.
func projectOf(rec *state.Record) string { return rec.Project }

// emit appends an event about rec to the node's log and counts it.
func (n *Node) emit(rec *state.Record, typ, reason string, figures map[string]float64) {
	n.cfg.Metrics.CountEvent(typ)
	if n.cfg.Events == nil {
		return
	}
	project := projectOf(rec)
	n.cfg.Events.Append(events.Event{Type: typ, SandboxID: rec.ID, NodeID: n.id, Project: project,
		Backend: rec.Backend, Labels: rec.Labels, Reason: reason, Figures: figures})
	n.log.Debug("sandbox event", "sandbox", rec.ID, "project", project, "type", typ, "reason", reason)
}

// resourceFigures are a record's limits as event figures.
func resourceFigures(rec *state.Record) map[string]float64 {
	return map[string]float64{
		"cpu_millis": float64(rec.CPUMillis), "memory_limit_bytes": float64(rec.MemoryBytes),
		"disk_limit_bytes": float64(rec.DiskBytes), "pids_limit": float64(rec.Pids),
	}
}

// samplerShare is the most of the time the sampler may spend sweeping:
// a sweep reads each sandbox's cgroup files (about 0.1 ms a sandbox on a
// 2-core VM), so on a node of thousands the sweeps come less often than
// the stats interval instead of taking a core.
const samplerShare = 0.1

// sampleAll reads every live sandbox's figures.
func (n *Node) sampleAll(ctx context.Context) {
	for _, e := range n.entries() {
		n.sample(ctx, e)
	}
}

// entries are the node's sandboxes at the call.
func (n *Node) entries() []*entry {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Collect(maps.Values(n.sandboxes))
}

// sample reads e's figures into its ring and emits the events its
// counters show (OOM kills, network refusals). ok is false when the
// sandbox is not live or cannot report.
func (n *Node) sample(ctx context.Context, e *entry) (Sample, bool) {
	s, st, sb, ok := n.measure(ctx, e)
	if !ok {
		return Sample{}, false
	}
	var refused *backend.NetworkStats
	if nw, ok := sb.(backend.Networker); ok {
		if ns, err := nw.NetworkStats(ctx); err == nil {
			refused = &ns
		}
	}
	o := &e.obs
	o.mu.Lock()
	o.lastCPU = st.CPUTime
	o.samples = append(o.samples, s)
	if len(o.samples) > statsRing {
		o.samples = slices.Delete(o.samples, 0, len(o.samples)-statsRing)
	}
	newOOM := o.primed && st.OOMKills > o.oomSeen
	o.oomSeen = max(o.oomSeen, st.OOMKills)
	var newRefused uint64
	if refused != nil {
		if o.primed && refused.Total > o.refusals {
			newRefused = refused.Total - o.refusals
		}
		o.refusals = max(o.refusals, refused.Total)
	}
	o.primed = true
	o.mu.Unlock()

	rec := e.snapshot()
	n.noteCheckpoint(rec, e, sb)
	if newOOM {
		f := resourceFigures(rec)
		f["memory_bytes"], f["oom_kills"] = float64(st.MemoryBytes), float64(st.OOMKills)
		n.emit(rec, events.OOMKilled, "the memory cgroup's OOM killer killed a process", f)
	}
	if newRefused > 0 {
		reason := "refused network attempts"
		if len(refused.Refusals) > 0 {
			reason = "refused " + destination(refused.Refusals[0])
		}
		n.emit(rec, events.NetworkRefused, reason, map[string]float64{
			"refused_new": float64(newRefused), "refused_total": float64(refused.Total)})
	}
	return s, true
}

// noteCheckpoint emits checkpointed once each time sb's state goes to disk.
func (n *Node) noteCheckpoint(rec *state.Record, e *entry, sb backend.Sandbox) {
	c, ok := sb.(backend.Checkpointer)
	if !ok {
		return
	}
	now := c.Checkpointed()
	e.obs.mu.Lock()
	first := now && !e.obs.checkpointed
	e.obs.checkpointed = now
	e.obs.mu.Unlock()
	if first {
		n.emit(rec, events.Checkpointed, "the paused sandbox's state went to disk", nil)
	}
}

// destination names a refused destination as the dashboard shows it.
func destination(r backend.NetworkRefusal) string {
	if r.Name != "" {
		return r.Name + " (dns)"
	}
	return fmt.Sprintf("%s:%d/%s", r.Address, r.Port, r.Protocol)
}

// noteExec records a finished exec and the events it shows.
func (n *Node) noteExec(ctx context.Context, e *entry, argv []string, started time.Time, res backend.ExecResult) {
	o := &e.obs
	o.mu.Lock()
	o.execs = append(o.execs, ExecRecord{Argv: argv, StartedAt: started, Result: res})
	if len(o.execs) > execRing {
		o.execs = slices.Delete(o.execs, 0, len(o.execs)-execRing)
	}
	o.mu.Unlock()
	rec := e.snapshot()
	if res.TimedOut {
		n.emit(rec, events.ExecTimedOut, fmt.Sprintf("%s ran past its timeout", argvName(argv)),
			map[string]float64{"duration_seconds": res.Duration.Seconds(), "cpu_seconds": res.CPUTime.Seconds()})
	}
	if res.OOMKilled {
		// The sample emits oom_killed when the cgroup counter moved; a
		// backend that knows only from the exec is reported here.
		o.mu.Lock()
		before := o.oomSeen
		o.mu.Unlock()
		n.sample(ctx, e)
		o.mu.Lock()
		moved := o.oomSeen > before
		o.mu.Unlock()
		if !moved {
			f := resourceFigures(rec)
			f["duration_seconds"] = res.Duration.Seconds()
			n.emit(rec, events.OOMKilled, fmt.Sprintf("OOM kill while %s ran", argvName(argv)), f)
		}
	}
}

func argvName(argv []string) string {
	s := strings.Join(argv, " ")
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return strconv.Quote(s)
}

// measure reads e's figures now, with CPU use since its latest sample,
// leaving the ring and the event counters alone; it also returns the raw
// figures and the live sandbox they came from.
func (n *Node) measure(ctx context.Context, e *entry) (Sample, backend.Stats, backend.Sandbox, bool) {
	e.mu.Lock()
	sb, deleting := e.sb, e.deleting
	e.mu.Unlock()
	sr, ok := sb.(backend.StatsReader)
	if !ok || deleting {
		return Sample{}, backend.Stats{}, nil, false
	}
	st, err := sr.Stats(ctx)
	if err != nil {
		return Sample{}, backend.Stats{}, nil, false
	}
	now := time.Now()
	s := Sample{Time: now, MemoryBytes: st.MemoryBytes, DiskBytes: st.DiskBytes, Pids: st.Pids,
		NetRxBytes: st.NetRxBytes, NetTxBytes: st.NetTxBytes}
	e.obs.mu.Lock()
	if k := len(e.obs.samples); k > 0 {
		if dt := now.Sub(e.obs.samples[k-1].Time); dt > 0 {
			s.CPUPercent = max(0, float64(st.CPUTime-e.obs.lastCPU)/float64(dt)*100)
		}
	}
	e.obs.mu.Unlock()
	return s, st, sb, true
}

// Stats reports sandboxes, with the sampled series and recent execs when
// history is set. The sandboxes named by ids are measured now; with no ids,
// every sandbox is reported from its latest sample (at most a sampling
// interval old), so that watching a whole node costs no extra reads.
func (n *Node) Stats(ctx context.Context, ids []string, history bool) ([]SandboxStats, error) {
	var list []*entry
	if len(ids) == 0 {
		list = n.entries()
	}
	for _, id := range ids {
		e, err := n.lookup(id)
		if err != nil {
			return nil, err
		}
		list = append(list, e)
	}
	out := make([]SandboxStats, 0, len(list))
	for _, e := range list {
		rec := e.snapshot()
		st := SandboxStats{Record: rec, Project: projectOf(rec)}
		e.obs.mu.Lock()
		if k := len(e.obs.samples); k > 0 && len(ids) == 0 && rec.Phase != state.PhaseStopped {
			st.Current = e.obs.samples[k-1]
		}
		e.obs.mu.Unlock()
		if st.Current.Time.IsZero() {
			st.Current, _, _, _ = n.measure(ctx, e)
		}
		if history {
			e.obs.mu.Lock()
			st.History = slices.Clone(e.obs.samples)
			st.Execs = slices.Clone(e.obs.execs)
			e.obs.mu.Unlock()
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b SandboxStats) int { return a.Record.CreatedAt.Compare(b.Record.CreatedAt) })
	return out, nil
}

// Latest is every sandbox's newest sample (zero before the first), without
// reading anything now: what metrics scrapes use.
func (n *Node) Latest() []SandboxStats {
	var out []SandboxStats
	for _, e := range n.entries() {
		rec := e.snapshot()
		st := SandboxStats{Record: rec, Project: projectOf(rec)}
		e.obs.mu.Lock()
		if k := len(e.obs.samples); k > 0 && rec.Phase != state.PhaseStopped {
			st.Current = e.obs.samples[k-1]
		}
		e.obs.mu.Unlock()
		out = append(out, st)
	}
	return out
}

// Overview is the node's capacity and what its sandboxes take of it.
type Overview struct {
	ID        string
	Backends  []string
	Capacity  Resources // BestEffort unused
	Committed Resources // limits of running and paused sandboxes
	Used      Resources // their latest samples (CPU in millicores)
	// Sandboxes counts sandboxes by backend, phase and project.
	Sandboxes map[[3]string]int
}

// Overview describes the node now, from the latest samples.
func (n *Node) Overview() Overview {
	o := Overview{ID: n.id, Capacity: n.capacity(), Sandboxes: map[[3]string]int{}}
	for name := range n.backends {
		o.Backends = append(o.Backends, name)
	}
	slices.Sort(o.Backends)
	for _, st := range n.Latest() {
		rec := st.Record
		o.Sandboxes[[3]string{rec.Backend, string(rec.Phase), st.Project}]++
		if rec.Phase != state.PhaseRunning && rec.Phase != state.PhasePaused {
			continue
		}
		o.Committed.CPUMillis += rec.CPUMillis
		o.Committed.MemoryBytes += committedMemory(rec)
		o.Committed.DiskBytes += rec.DiskBytes
		o.Committed.Pids += rec.Pids
		o.Used.CPUMillis += int64(st.Current.CPUPercent * 10)
		o.Used.MemoryBytes += st.Current.MemoryBytes
		o.Used.DiskBytes += st.Current.DiskBytes
		o.Used.Pids += st.Current.Pids
	}
	return o
}

// capacity is the machine: its cores, memory, the data dir's filesystem
// and the kernel's pid limit.
func (n *Node) capacity() Resources {
	c := Resources{CPUMillis: int64(runtime.NumCPU()) * 1000, MemoryBytes: hostMemory()}
	var fs unix.Statfs_t
	if unix.Statfs(n.cfg.DataDir, &fs) == nil {
		c.DiskBytes = int64(fs.Blocks) * fs.Bsize
	}
	if b, err := os.ReadFile(filepath.Join("/proc/sys/kernel", "pid_max")); err == nil {
		c.Pids, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	return c
}
