package cluster

import (
	"context"
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
)

// RolloutHandler serves the node's RolloutService (inner) for control
// instances, only calls signed with the cluster secret. Forks and restores
// are new sandboxes of this node: the agent admits each against the
// capacity as it admits a create, and counts those made in the node's
// load at once. Every other call goes straight to inner.
func (a *NodeAgent) RolloutHandler(inner corralv1connect.RolloutServiceHandler, secret Secret, opts ...connect.HandlerOption) (string, http.Handler) {
	path, h := corralv1connect.NewRolloutServiceHandler(agentRollouts{RolloutServiceHandler: inner, a: a}, opts...)
	return path, RequireSigned(secret, h)
}

type agentRollouts struct {
	corralv1connect.RolloutServiceHandler
	a *NodeAgent
}

// Fork admits as many of the forks as the capacity takes (the parent's
// resources each), forks those, and fails the rest one by one naming what
// ran out; with none admitted the call fails and nothing is made.
func (r agentRollouts) Fork(ctx context.Context, req *connect.Request[corralv1.ForkRequest]) (*connect.Response[corralv1.ForkResponse], error) {
	a, m := r.a, req.Msg
	if m.Count < 1 || m.Count > maxForks {
		return nil, errdefs.InvalidArgument("count: %d is out of range (allowed 1 to %d)", m.Count, maxForks)
	}
	got, err := a.SandboxServiceHandler.Get(ctx, connect.NewRequest(&corralv1.GetRequest{Id: m.SandboxId}))
	if err != nil {
		return nil, err
	}
	cost := a.cost(&corralv1.CreateRequest{Resources: got.Msg.GetSandbox().GetResources()})
	a.mu.Lock()
	admitted := int32(0)
	var why error
	for admitted < m.Count {
		if why = a.admitLocked(cost); why != nil {
			break
		}
		a.inflight.add(cost, 1)
		admitted++
	}
	a.mu.Unlock()
	if admitted == 0 {
		return nil, fmt.Errorf("fork sandbox %s: %w", m.SandboxId, why)
	}
	asked := &corralv1.ForkRequest{SandboxId: m.SandboxId, Count: admitted}
	resp, err := r.RolloutServiceHandler.Fork(ctx, connect.NewRequest(asked))
	a.mu.Lock()
	a.inflight.add(Load{Sandboxes: int64(admitted), CPUMillis: int64(admitted) * cost.CPUMillis, MemoryBytes: int64(admitted) * cost.MemoryBytes}, -1)
	if err == nil {
		for _, f := range resp.Msg.Forks {
			if sb := f.GetSandbox(); sb != nil {
				a.countMadeLocked(cost, sb)
			}
		}
	}
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	for i := admitted; i < m.Count; i++ {
		resp.Msg.Forks = append(resp.Msg.Forks, &corralv1.ForkOutcome{Error: fmt.Sprintf("fork %d of sandbox %s: %v", i, m.SandboxId, why)})
	}
	return resp, nil
}

// Restore admits the new sandbox against the capacity with the
// snapshot's resources, as a create, and counts it in the node's load
// once made.
func (r agentRollouts) Restore(ctx context.Context, req *connect.Request[corralv1.RestoreRequest]) (*connect.Response[corralv1.RestoreResponse], error) {
	a := r.a
	list, err := r.RolloutServiceHandler.ListSnapshots(ctx, connect.NewRequest(&corralv1.ListSnapshotsRequest{}))
	if err != nil {
		return nil, err
	}
	var res *corralv1.Resources
	for _, s := range list.Msg.Snapshots {
		if s.Id == req.Msg.SnapshotId {
			res = s.GetResources()
		}
	}
	if res == nil {
		return r.RolloutServiceHandler.Restore(ctx, req) // its NotFound or InvalidArgument
	}
	var resp *connect.Response[corralv1.RestoreResponse]
	err = a.admitOne(a.cost(&corralv1.CreateRequest{Resources: res}), "restore snapshot "+req.Msg.SnapshotId, func() (*corralv1.Sandbox, error) {
		var err error
		if resp, err = r.RolloutServiceHandler.Restore(ctx, req); err != nil {
			return nil, err
		}
		return resp.Msg.GetSandbox(), nil
	})
	return resp, err
}

// admitOne admits one sandbox of cost against the capacity, runs create
// with it counted in flight, and counts the sandbox create made in the load.
func (a *NodeAgent) admitOne(cost Load, what string, create func() (*corralv1.Sandbox, error)) error {
	a.mu.Lock()
	if err := a.admitLocked(cost); err != nil {
		a.mu.Unlock()
		return fmt.Errorf("%s: %w", what, err)
	}
	a.inflight.add(cost, 1)
	a.mu.Unlock()
	sb, err := create()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inflight.add(cost, -1)
	if err == nil {
		a.countMadeLocked(cost, sb)
	}
	return err
}

// countMadeLocked adds a sandbox the agent made to its load; a.mu is held.
func (a *NodeAgent) countMadeLocked(cost Load, sb *corralv1.Sandbox) {
	a.delta.add(cost, 1)
	a.delta.count(sb.GetBackend(), sb.GetLabels(), 1)
	a.delta.countProject(sb, 1)
}
