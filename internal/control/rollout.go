package control

import (
	"context"
	"sort"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/execlog"
	"github.com/corral-dev/corral/internal/node"
)

// RolloutService implements corral.v1.RolloutService over the nodes of a
// SandboxService (it routes the same way).
type RolloutService struct {
	sandboxes *Service
}

var _ corralv1connect.RolloutServiceHandler = (*RolloutService)(nil)

// NewRolloutService serves the nodes of sandboxes.
func NewRolloutService(sandboxes *Service) *RolloutService {
	return &RolloutService{sandboxes: sandboxes}
}

var execStateToProto = map[execlog.State]corralv1.ExecState{
	execlog.Running: corralv1.ExecState_EXEC_STATE_RUNNING,
	execlog.Done:    corralv1.ExecState_EXEC_STATE_DONE,
	execlog.Failed:  corralv1.ExecState_EXEC_STATE_FAILED,
	execlog.Lost:    corralv1.ExecState_EXEC_STATE_LOST,
}

func (r *RolloutService) ListExecs(ctx context.Context, req *connect.Request[corralv1.ListExecsRequest]) (*connect.Response[corralv1.ListExecsResponse], error) {
	m := req.Msg
	n, err := r.sandboxes.route(m.SandboxId)
	if err != nil {
		return nil, err
	}
	ents, next, err := n.ListExecs(ctx, m.SandboxId, m.SinceSeq, int(m.PageSize))
	if err != nil {
		return nil, err
	}
	resp := &corralv1.ListExecsResponse{NextSeq: next}
	for _, e := range ents {
		p := &corralv1.ExecLogEntry{
			Seq: e.Seq, IdempotencyKey: e.Key, Argv: e.Argv, Shell: e.Shell,
			State: execStateToProto[e.State], Error: e.Error,
			StartedAt:   timestamppb.New(e.StartedAt),
			OutputBytes: e.OutputBytes, OutputKeptBytes: e.OutputKeptBytes,
		}
		if !e.EndedAt.IsZero() {
			p.EndedAt = timestamppb.New(e.EndedAt)
		}
		if e.State == execlog.Done {
			p.Result = &corralv1.ExecResult{
				ExitCode: int32(e.Result.ExitCode), Signal: int32(e.Result.Signal),
				TimedOut: e.Result.TimedOut, OomKilled: e.Result.OOMKilled, Truncated: e.Result.Truncated,
				Duration: durationpb.New(e.Result.Duration), ExecSeq: e.Seq,
			}
		}
		resp.Entries = append(resp.Entries, p)
	}
	return connect.NewResponse(resp), nil
}

func failuresToProto(f map[string]error) []*corralv1.SandboxFailure {
	out := make([]*corralv1.SandboxFailure, 0, len(f))
	for id, err := range f {
		out = append(out, &corralv1.SandboxFailure{Id: id, Error: err.Error()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Id < out[j].Id })
	return out
}

func (r *RolloutService) PauseMany(ctx context.Context, req *connect.Request[corralv1.PauseManyRequest]) (*connect.Response[corralv1.PauseManyResponse], error) {
	res, err := r.sandboxes.local.PauseMany(ctx, req.Msg.Labels, req.Msg.Reclaim, VisibleTo(ctx))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.PauseManyResponse{
		Paused: int32(res.Done), ResidentBeforeBytes: res.Before, ResidentAfterBytes: res.After,
		Failures: failuresToProto(res.Failures),
	}), nil
}

func (r *RolloutService) ResumeMany(ctx context.Context, req *connect.Request[corralv1.ResumeManyRequest]) (*connect.Response[corralv1.ResumeManyResponse], error) {
	res, err := r.sandboxes.local.ResumeMany(ctx, req.Msg.Labels, VisibleTo(ctx))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.ResumeManyResponse{Resumed: int32(res.Done), Failures: failuresToProto(res.Failures)}), nil
}

func (r *RolloutService) Fork(ctx context.Context, req *connect.Request[corralv1.ForkRequest]) (*connect.Response[corralv1.ForkResponse], error) {
	n, err := r.sandboxes.route(req.Msg.SandboxId)
	if err != nil {
		return nil, err
	}
	res, err := n.Fork(ctx, req.Msg.SandboxId, int(req.Msg.Count))
	if err != nil {
		return nil, err
	}
	out := &corralv1.ForkResponse{Image: res.Image, ProcessesCarried: res.ProcessesCarried, SnapshotId: res.Snapshot}
	for _, f := range res.Forks {
		o := &corralv1.ForkOutcome{}
		if f.Err != nil {
			o.Error = toConnect(f.Err).Error()
		} else {
			o.Sandbox = sandboxToProto(f.Sandbox)
		}
		out.Forks = append(out.Forks, o)
	}
	return connect.NewResponse(out), nil
}

func snapshotToProto(s *node.SnapshotInfo) *corralv1.Snapshot {
	return &corralv1.Snapshot{Id: s.ID, SandboxId: s.SandboxID, Backend: s.Backend, Bytes: s.Bytes,
		Created: timestamppb.New(s.CreatedAt), Project: s.Project,
		Resources: &corralv1.Resources{CpuMillis: s.Source.CPUMillis, MemoryBytes: s.Source.MemoryBytes, DiskBytes: s.Source.DiskBytes}}
}

func (r *RolloutService) Snapshot(ctx context.Context, req *connect.Request[corralv1.SnapshotRequest]) (*connect.Response[corralv1.SnapshotResponse], error) {
	n, err := r.sandboxes.route(req.Msg.SandboxId)
	if err != nil {
		return nil, err
	}
	s, err := n.Snapshot(ctx, req.Msg.SandboxId)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.SnapshotResponse{Snapshot: snapshotToProto(s)}), nil
}

// Restore, ListSnapshots and DeleteSnapshot act on this node's snapshots;
// the handlers hide those of projects the caller does not see.
func (r *RolloutService) Restore(ctx context.Context, req *connect.Request[corralv1.RestoreRequest]) (*connect.Response[corralv1.RestoreResponse], error) {
	sb, err := r.sandboxes.local.Restore(ctx, req.Msg.SnapshotId, req.Msg.Labels, VisibleTo(ctx))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.RestoreResponse{Sandbox: sandboxToProto(sb)}), nil
}

func (r *RolloutService) ListSnapshots(ctx context.Context, _ *connect.Request[corralv1.ListSnapshotsRequest]) (*connect.Response[corralv1.ListSnapshotsResponse], error) {
	return connect.NewResponse(&corralv1.ListSnapshotsResponse{Snapshots: toProtos(r.sandboxes.local.ListSnapshots(ctx, VisibleTo(ctx)), snapshotToProto)}), nil
}

func (r *RolloutService) DeleteSnapshot(ctx context.Context, req *connect.Request[corralv1.DeleteSnapshotRequest]) (*connect.Response[corralv1.DeleteSnapshotResponse], error) {
	if err := r.sandboxes.local.DeleteSnapshot(ctx, req.Msg.SnapshotId, VisibleTo(ctx)); err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.DeleteSnapshotResponse{}), nil
}
