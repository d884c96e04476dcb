package control

import (
	"context"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/node"
)

// ObserveService implements corral.v1.ObserveService over the local node
// and its event log.
type ObserveService struct {
	node   *node.Node
	events *events.Log
}

var _ corralv1connect.ObserveServiceHandler = (*ObserveService)(nil)

// NewObserveService serves n's figures and log's events.
func NewObserveService(n *node.Node, log *events.Log) *ObserveService {
	return &ObserveService{node: n, events: log}
}

// maxStatsIDs bounds one Stats request.
const maxStatsIDs = 1000

func (s *ObserveService) Stats(ctx context.Context, req *connect.Request[corralv1.StatsRequest]) (*connect.Response[corralv1.StatsResponse], error) {
	if len(req.Msg.Ids) > maxStatsIDs {
		return nil, errdefs.InvalidArgument("ids: %d ids is over the limit of %d", len(req.Msg.Ids), maxStatsIDs)
	}
	for i, id := range req.Msg.Ids {
		if id == "" {
			return nil, errdefs.InvalidArgument("ids[%d]: empty", i)
		}
	}
	list, err := s.node.Stats(ctx, req.Msg.Ids, req.Msg.History)
	if err != nil {
		return nil, err
	}
	out := &corralv1.StatsResponse{}
	visible := VisibleTo(ctx)
	for _, st := range list {
		if visible != nil && !visible(st.Project) {
			continue
		}
		rec := st.Record
		m := &corralv1.SandboxStats{
			Id: rec.ID, Backend: rec.Backend, Project: st.Project, State: string(rec.Phase),
			CpuLimitMillis: rec.CPUMillis, MemoryLimitBytes: rec.MemoryBytes, DiskLimitBytes: rec.DiskBytes,
			PidsLimit: rec.Pids, Labels: rec.Labels,
		}
		if !st.Current.Time.IsZero() {
			m.Current = sampleToProto(st.Current)
		}
		for _, h := range st.History {
			m.History = append(m.History, sampleToProto(h))
		}
		for _, x := range st.Execs {
			m.RecentExecs = append(m.RecentExecs, &corralv1.ExecRecord{
				Argv: x.Argv, ExitCode: int32(x.Result.ExitCode), Signal: int32(x.Result.Signal),
				TimedOut: x.Result.TimedOut, OomKilled: x.Result.OOMKilled,
				StartedAt: timestamppb.New(x.StartedAt), Duration: durationpb.New(x.Result.Duration),
			})
		}
		out.Sandboxes = append(out.Sandboxes, m)
	}
	return connect.NewResponse(out), nil
}

func sampleToProto(s node.Sample) *corralv1.StatsSample {
	return &corralv1.StatsSample{
		Time: timestamppb.New(s.Time), CpuPercent: s.CPUPercent, MemoryBytes: s.MemoryBytes,
		DiskBytes: s.DiskBytes, Pids: s.Pids, NetRxBytes: s.NetRxBytes, NetTxBytes: s.NetTxBytes,
	}
}

func (s *ObserveService) WatchEvents(ctx context.Context, req *connect.Request[corralv1.WatchEventsRequest], stream *connect.ServerStream[corralv1.WatchEventsResponse]) error {
	for i, t := range req.Msg.Types {
		if !slices.Contains(events.Types, t) {
			return errdefs.InvalidArgument("types[%d]: unknown event type %.64q (known: %s)", i, t, strings.Join(events.Types, ", "))
		}
	}
	f := events.Filter{Project: req.Msg.Project, Labels: req.Msg.Labels, SandboxIDs: req.Msg.SandboxIds, Types: req.Msg.Types}
	// Headers go out at once, so a watcher knows it is subscribed before
	// the first event.
	if err := stream.Send(nil); err != nil {
		return err
	}
	visible := VisibleTo(ctx)
	for e := range s.events.Watch(ctx, req.Msg.SinceSeq, f) {
		if visible != nil && !visible(e.Project) {
			continue
		}
		if err := stream.Send(&corralv1.WatchEventsResponse{Event: EventToProto(e)}); err != nil {
			return err
		}
	}
	return nil
}

// EventToProto converts an event for the API (and the dashboard's stream).
func EventToProto(e *events.Event) *corralv1.Event {
	return &corralv1.Event{
		Seq: e.Seq, Time: timestamppb.New(e.Time), Type: e.Type, SandboxId: e.SandboxID, NodeId: e.NodeID,
		Project: e.Project, Backend: e.Backend, Labels: e.Labels, Reason: e.Reason, Figures: e.Figures,
	}
}

func (s *ObserveService) Nodes(ctx context.Context, _ *connect.Request[corralv1.NodesRequest]) (*connect.Response[corralv1.NodesResponse], error) {
	o := s.node.Overview()
	res := func(r node.Resources) *corralv1.Resources {
		return &corralv1.Resources{CpuMillis: r.CPUMillis, MemoryBytes: r.MemoryBytes, DiskBytes: r.DiskBytes, Pids: r.Pids}
	}
	info := &corralv1.NodeInfo{Id: o.ID, Backends: o.Backends, Capacity: res(o.Capacity),
		Committed: res(o.Committed), Used: res(o.Used), SandboxesByState: map[string]int64{},
		LastEventSeq: s.events.LastSeq()}
	for k, v := range o.Sandboxes {
		info.SandboxesByState[k[1]] += int64(v)
	}
	return connect.NewResponse(&corralv1.NodesResponse{Nodes: []*corralv1.NodeInfo{info}}), nil
}
