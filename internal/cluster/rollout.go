package cluster

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
)

// Rollouts is a control instance's RolloutService. A per-sandbox call goes
// to the node in the sandbox id (rolloutUnary); a call by label fans out
// to every node (fanOut) and merges the answers, a node that cannot be
// asked being one failure of the answer, not of the call.
//
// A new per-sandbox RPC is routed by a method whose body is one line:
//
//	func (r Rollouts) Snapshot(ctx context.Context, req *connect.Request[corralv1.SnapshotRequest]) (*connect.Response[corralv1.SnapshotResponse], error) {
//		return rolloutUnary(r.P, ctx, req.Msg.SandboxId, req, corralv1connect.RolloutServiceClient.Snapshot)
//	}
//
// Any id of the form <node>-<hex> routes the same way. Rollouts does not
// embed the generated Unimplemented handler on purpose: an RPC added to
// the proto without a route here fails the build instead of answering
// Unimplemented through the control plane.
type Rollouts struct{ P *Proxy }

var _ corralv1connect.RolloutServiceHandler = Rollouts{}

// fanOutParallel bounds the nodes asked at once by a call by label.
const fanOutParallel = 16

// maxForks is the node's bound on one Fork call (checked here too, so a
// bad count fails before anything is reserved).
const maxForks = 64

// rolloutUnary forwards a per-sandbox RolloutService call to the node
// owning id (Unavailable naming the node when it is lost or unreachable).
func rolloutUnary[Req, Resp any](p *Proxy, ctx context.Context, id string, req *connect.Request[Req],
	call func(corralv1connect.RolloutServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) (*connect.Response[Resp], error) {
	v, _, err := p.nodeFor(id)
	if err != nil {
		return nil, err
	}
	resp, err := call(p.nodeClient(v).rollout, ctx, connect.NewRequest(req.Msg))
	return resp, unreachable(v, err)
}

// fanOut calls fn on every node that is not lost, fanOutParallel at once.
// A lost node, or one whose call fails, is a NodeFailure (sorted by node
// id); an InvalidArgument answer is the same on every node and fails the
// whole call instead.
func fanOut(p *Proxy, fn func(v *NodeView, c corralv1connect.RolloutServiceClient) error) ([]*corralv1.NodeFailure, error) {
	var (
		mu       sync.Mutex
		failures []*corralv1.NodeFailure
		invalid  error
		wg       sync.WaitGroup
	)
	sem := make(chan struct{}, fanOutParallel)
	for _, v := range p.Nodes().Nodes {
		if v.State == NodeLost {
			failures = append(failures, &corralv1.NodeFailure{NodeId: v.ID, Error: v.Reason})
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := fn(v, p.nodeClient(v).rollout)
			if err == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if connect.CodeOf(err) == connect.CodeInvalidArgument {
				invalid = err
				return
			}
			failures = append(failures, &corralv1.NodeFailure{NodeId: v.ID, Error: connectMessage(unreachable(v, err))})
		}()
	}
	wg.Wait()
	if invalid != nil {
		return nil, invalid
	}
	sort.Slice(failures, func(i, j int) bool { return failures[i].NodeId < failures[j].NodeId })
	return failures, nil
}

// gather sends req to every node (fanOut) and hands each answer to merge,
// one at a time.
func gather[Req, Resp any](p *Proxy, ctx context.Context, req *connect.Request[Req],
	call func(corralv1connect.RolloutServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
	merge func(*Resp)) ([]*corralv1.NodeFailure, error) {
	var mu sync.Mutex
	return fanOut(p, func(_ *NodeView, c corralv1connect.RolloutServiceClient) error {
		resp, err := call(c, ctx, connect.NewRequest(req.Msg))
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		merge(resp.Msg)
		return nil
	})
}

// wantLike is the admission of one more sandbox with these resources, on
// the quotas of project when it has one.
func (p *Proxy) wantLike(ctx context.Context, backend string, res *corralv1.Resources, project string) (Want, error) {
	want := Want{Backend: backend, CPUMillis: res.GetCpuMillis(), MemoryBytes: res.GetMemoryBytes(), DiskBytes: res.GetDiskBytes()}
	if project != "" && p.cfg.Quotas != nil {
		qs, err := p.cfg.Quotas(ctx, project)
		if err != nil {
			return Want{}, err
		}
		want.Project, want.Quotas = project, qs
	}
	return want, nil
}

func sortFailures(f []*corralv1.SandboxFailure) {
	sort.Slice(f, func(i, j int) bool { return f[i].Id < f[j].Id })
}

func needLabels(labels map[string]string) error {
	if len(labels) == 0 {
		return errdefs.InvalidArgument("labels: at least one is required (a whole node is never paused by accident)")
	}
	return nil
}

func (r Rollouts) ListExecs(ctx context.Context, req *connect.Request[corralv1.ListExecsRequest]) (*connect.Response[corralv1.ListExecsResponse], error) {
	return rolloutUnary(r.P, ctx, req.Msg.SandboxId, req, corralv1connect.RolloutServiceClient.ListExecs)
}

// PauseMany pauses the caller's sandboxes carrying labels on every node;
// the node scopes them to the caller's projects.
func (r Rollouts) PauseMany(ctx context.Context, req *connect.Request[corralv1.PauseManyRequest]) (*connect.Response[corralv1.PauseManyResponse], error) {
	if err := needLabels(req.Msg.Labels); err != nil {
		return nil, err
	}
	out := &corralv1.PauseManyResponse{}
	var err error
	out.NodeFailures, err = gather(r.P, ctx, req, corralv1connect.RolloutServiceClient.PauseMany, func(m *corralv1.PauseManyResponse) {
		out.Failures = append(out.Failures, m.Failures...)
		out.Paused += m.Paused
		out.ResidentBeforeBytes += m.ResidentBeforeBytes
		out.ResidentAfterBytes += m.ResidentAfterBytes
	})
	if err != nil {
		return nil, err
	}
	sortFailures(out.Failures)
	return connect.NewResponse(out), nil
}

func (r Rollouts) ResumeMany(ctx context.Context, req *connect.Request[corralv1.ResumeManyRequest]) (*connect.Response[corralv1.ResumeManyResponse], error) {
	if err := needLabels(req.Msg.Labels); err != nil {
		return nil, err
	}
	out := &corralv1.ResumeManyResponse{}
	var err error
	out.NodeFailures, err = gather(r.P, ctx, req, corralv1connect.RolloutServiceClient.ResumeMany, func(m *corralv1.ResumeManyResponse) {
		out.Resumed += m.Resumed
		out.Failures = append(out.Failures, m.Failures...)
	})
	if err != nil {
		return nil, err
	}
	sortFailures(out.Failures)
	return connect.NewResponse(out), nil
}

// Fork makes the forks on the parent's node (they start from its files
// there). Each fork is admitted first like a create on that node: against
// its capacity and the project's quota over the cluster; the node forks
// only those, and the rest fail one by one with the reason. With none
// admitted the call fails and nothing is made.
func (r Rollouts) Fork(ctx context.Context, req *connect.Request[corralv1.ForkRequest]) (*connect.Response[corralv1.ForkResponse], error) {
	m := req.Msg
	if m.Count < 1 || m.Count > maxForks {
		return nil, errdefs.InvalidArgument("count: %d is out of range (allowed 1 to %d)", m.Count, maxForks)
	}
	v, c, err := r.P.nodeFor(m.SandboxId)
	if err != nil {
		return nil, err
	}
	got, err := c.Get(ctx, connect.NewRequest(&corralv1.GetRequest{Id: m.SandboxId}))
	if err != nil {
		return nil, unreachable(v, err)
	}
	parent := got.Msg.GetSandbox()
	want, err := r.P.wantLike(ctx, parent.GetBackend(), parent.GetResources(), parent.GetProject())
	if err != nil {
		return nil, err
	}
	pls, why := r.P.cfg.Placer.Reserve(v.ID, want, int(m.Count))
	if len(pls) == 0 {
		return nil, fmt.Errorf("fork sandbox %s: %w", m.SandboxId, why)
	}
	resp, err := r.P.nodeClient(v).rollout.Fork(ctx, connect.NewRequest(&corralv1.ForkRequest{SandboxId: m.SandboxId, Count: int32(len(pls))}))
	if err != nil {
		for _, pl := range pls {
			pl.Done(false)
		}
		return nil, unreachable(v, err)
	}
	out := resp.Msg
	for i, pl := range pls {
		pl.Done(i < len(out.Forks) && out.Forks[i].Sandbox != nil)
	}
	for i := len(pls); i < int(m.Count); i++ {
		out.Forks = append(out.Forks, &corralv1.ForkOutcome{Error: fmt.Sprintf("fork %d of sandbox %s: %v", i, m.SandboxId, why)})
	}
	return connect.NewResponse(out), nil
}
