package client

import (
	"context"
	"iter"
	"maps"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// SandboxStats are a sandbox's resource figures.
type SandboxStats struct {
	ID, Backend, Project string
	// State is running, paused or stopped.
	State  string
	Labels map[string]string
	// Current is read when the call is served (zero for a stopped sandbox).
	Current                                                     StatsSample
	CPULimitMillis, MemoryLimitBytes, DiskLimitBytes, PidsLimit int64
	// History (oldest first) and RecentExecs (newest last) are filled
	// with StatsOptions.History.
	History     []StatsSample
	RecentExecs []ExecRecord
}

// StatsSample is one reading of a sandbox's figures.
type StatsSample struct {
	Time time.Time
	// CPUPercent is the CPU use since the previous sample (100 = one core).
	CPUPercent             float64
	MemoryBytes, DiskBytes int64
	Pids                   int64
	NetRxBytes, NetTxBytes uint64
}

// ExecRecord is one finished command.
type ExecRecord struct {
	Argv                []string
	ExitCode, Signal    int
	TimedOut, OOMKilled bool
	StartedAt           time.Time
	Duration            time.Duration
}

// StatsOptions select what Stats reports.
type StatsOptions struct {
	// IDs are the sandboxes (empty: every one on the server).
	IDs []string
	// History adds the sampled series and recent execs.
	History bool
}

// Stats reports sandboxes' resource figures.
func (c *Client) Stats(ctx context.Context, o StatsOptions) ([]SandboxStats, error) {
	resp, err := c.obs.Stats(ctx, connect.NewRequest(&corralv1.StatsRequest{Ids: o.IDs, History: o.History}))
	if err != nil {
		return nil, wrapErr(err)
	}
	out := make([]SandboxStats, 0, len(resp.Msg.Sandboxes))
	for _, m := range resp.Msg.Sandboxes {
		st := SandboxStats{ID: m.Id, Backend: m.Backend, Project: m.Project, State: m.State, Labels: maps.Clone(m.Labels),
			CPULimitMillis: m.CpuLimitMillis, MemoryLimitBytes: m.MemoryLimitBytes, DiskLimitBytes: m.DiskLimitBytes,
			PidsLimit: m.PidsLimit}
		if m.Current != nil {
			st.Current = sampleFromProto(m.Current)
		}
		for _, h := range m.History {
			st.History = append(st.History, sampleFromProto(h))
		}
		for _, x := range m.RecentExecs {
			st.RecentExecs = append(st.RecentExecs, ExecRecord{Argv: x.Argv, ExitCode: int(x.ExitCode), Signal: int(x.Signal),
				TimedOut: x.TimedOut, OOMKilled: x.OomKilled, StartedAt: x.StartedAt.AsTime(), Duration: x.Duration.AsDuration()})
		}
		out = append(out, st)
	}
	return out, nil
}

func sampleFromProto(m *corralv1.StatsSample) StatsSample {
	return StatsSample{Time: m.Time.AsTime(), CPUPercent: m.CpuPercent, MemoryBytes: m.MemoryBytes, DiskBytes: m.DiskBytes,
		Pids: m.Pids, NetRxBytes: m.NetRxBytes, NetTxBytes: m.NetTxBytes}
}

// Event is one lifecycle event of a sandbox.
type Event struct {
	// Seq grows by one per event on a node and survives daemon restarts:
	// pass the last one seen as EventOptions.After to resume.
	Seq       uint64
	Time      time.Time
	Type      string
	SandboxID string
	NodeID    string
	Project   string
	Backend   string
	Labels    map[string]string
	Reason    string
	// Figures are the resource numbers that go with the event
	// (memory_bytes, memory_limit_bytes, duration_seconds …).
	Figures map[string]float64
}

// Event types.
const (
	EventCreated         = "created"
	EventStarted         = "started"
	EventPaused          = "paused"
	EventResumed         = "resumed"
	EventCheckpointed    = "checkpointed"
	EventOOMKilled       = "oom_killed"
	EventExecTimedOut    = "exec_timed_out"
	EventIdleStopped     = "idle_stopped"
	EventLifetimeReached = "lifetime_reached"
	EventStopped         = "stopped"
	EventDegraded        = "degraded"
	EventNetworkRefused  = "network_refused"
	EventDeleted         = "deleted"
)

// EventOptions select the events Events yields; an event must match every
// filter that is set.
type EventOptions struct {
	// After replays the kept events with a larger sequence number first
	// (nil: only events from now on).
	After      *uint64
	Project    string
	Labels     map[string]string
	SandboxIDs []string
	Types      []string
}

// Events streams lifecycle events until ctx ends or an error, which is
// yielded last. To see every event from a point on, pass the last Seq seen
// (or a node's LastEventSeq from Nodes) as After: a stream without After
// starts wherever the server is when the request arrives.
func (c *Client) Events(ctx context.Context, o EventOptions) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		stream, err := c.obs.WatchEvents(ctx, connect.NewRequest(&corralv1.WatchEventsRequest{
			SinceSeq: o.After, Project: o.Project, Labels: o.Labels, SandboxIds: o.SandboxIDs, Types: o.Types}))
		if err != nil {
			yield(Event{}, wrapErr(err))
			return
		}
		defer stream.Close()
		for stream.Receive() {
			m := stream.Msg().GetEvent()
			if m == nil {
				continue
			}
			e := Event{Seq: m.Seq, Time: m.Time.AsTime(), Type: m.Type, SandboxID: m.SandboxId, NodeID: m.NodeId,
				Project: m.Project, Backend: m.Backend, Labels: m.Labels, Reason: m.Reason, Figures: m.Figures}
			if !yield(e, nil) {
				return
			}
		}
		if err := stream.Err(); err != nil && ctx.Err() == nil {
			yield(Event{}, wrapErr(err))
		}
	}
}

// NodeInfo describes one node: its capacity and what its sandboxes take.
type NodeInfo struct {
	ID       string
	Backends []string
	// Capacity is the machine; Committed the limits of its running and
	// paused sandboxes; Used their latest samples (CPU in millicores).
	Capacity, Committed, Used Resources
	SandboxesByState          map[string]int64
	// LastEventSeq is the newest event's sequence number: Events with
	// After set to it misses nothing that happens afterwards.
	LastEventSeq uint64
}

// Nodes describes the nodes the server knows.
func (c *Client) Nodes(ctx context.Context) ([]NodeInfo, error) {
	resp, err := c.obs.Nodes(ctx, connect.NewRequest(&corralv1.NodesRequest{}))
	if err != nil {
		return nil, wrapErr(err)
	}
	res := func(r *corralv1.Resources) Resources {
		return Resources{CPUMillis: r.GetCpuMillis(), MemoryBytes: r.GetMemoryBytes(), DiskBytes: r.GetDiskBytes(), Pids: r.GetPids()}
	}
	var out []NodeInfo
	for _, n := range resp.Msg.Nodes {
		out = append(out, NodeInfo{ID: n.Id, Backends: n.Backends, Capacity: res(n.Capacity), Committed: res(n.Committed),
			Used: res(n.Used), SandboxesByState: maps.Clone(n.SandboxesByState), LastEventSeq: n.LastEventSeq})
	}
	return out, nil
}
