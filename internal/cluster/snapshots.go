package cluster

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
)

// Snapshots live on the node of the sandbox they were taken of, and their
// ids do not name it: a call by snapshot id asks every node, and only the
// holder answers anything but NotFound (a node without the snapshot makes
// nothing, so asking it is harmless).

func (r Rollouts) Snapshot(ctx context.Context, req *connect.Request[corralv1.SnapshotRequest]) (*connect.Response[corralv1.SnapshotResponse], error) {
	return rolloutUnary(r.P, ctx, req.Msg.SandboxId, req, corralv1connect.RolloutServiceClient.Snapshot)
}

func (r Rollouts) ListSnapshots(ctx context.Context, req *connect.Request[corralv1.ListSnapshotsRequest]) (*connect.Response[corralv1.ListSnapshotsResponse], error) {
	out := &corralv1.ListSnapshotsResponse{}
	nf, err := gather(r.P, ctx, req, corralv1connect.RolloutServiceClient.ListSnapshots, func(m *corralv1.ListSnapshotsResponse) {
		out.Snapshots = append(out.Snapshots, m.Snapshots...)
	})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(out.Snapshots, func(i, j int) bool {
		return out.Snapshots[i].GetCreated().AsTime().Before(out.Snapshots[j].GetCreated().AsTime())
	})
	out.NodeFailures = nf
	return connect.NewResponse(out), nil
}

// Restore makes the new sandbox on the snapshot's node. It is admitted
// first as a create on that node is: against the node's capacity and the
// project's quota over the cluster, counted in flight until the node
// reports it; the node's edge admits it again. A snapshot no listing
// shows is asked of every node as before (which answers NotFound, or
// InvalidArgument for a malformed id).
func (r Rollouts) Restore(ctx context.Context, req *connect.Request[corralv1.RestoreRequest]) (*connect.Response[corralv1.RestoreResponse], error) {
	restore := func(c corralv1connect.RolloutServiceClient) (*connect.Response[corralv1.RestoreResponse], error) {
		return c.Restore(ctx, connect.NewRequest(req.Msg))
	}
	v, snap := r.findSnapshot(ctx, req.Msg.SnapshotId)
	if v == nil {
		return onHolder(r.P, req.Msg.SnapshotId, restore)
	}
	want, err := r.P.wantLike(ctx, snap.GetBackend(), snap.GetResources(), snap.GetProject())
	if err != nil {
		return nil, err
	}
	pls, why := r.P.cfg.Placer.Reserve(v.ID, want, 1)
	if len(pls) == 0 {
		return nil, fmt.Errorf("restore snapshot %s: %w", snap.GetId(), why)
	}
	resp, err := restore(r.P.nodeClient(v).rollout)
	pls[0].Done(err == nil)
	return resp, unreachable(v, err)
}

// findSnapshot is the node holding snapshot id and its listing there, as
// the caller may see it (nil when no node that answered lists it).
func (r Rollouts) findSnapshot(ctx context.Context, id string) (*NodeView, *corralv1.Snapshot) {
	var (
		mu    sync.Mutex
		found *NodeView
		snap  *corralv1.Snapshot
	)
	_, _ = fanOut(r.P, func(v *NodeView, c corralv1connect.RolloutServiceClient) error {
		resp, err := c.ListSnapshots(ctx, connect.NewRequest(&corralv1.ListSnapshotsRequest{}))
		if err != nil {
			return err
		}
		for _, s := range resp.Msg.Snapshots {
			if s.Id == id {
				mu.Lock()
				found, snap = v, s
				mu.Unlock()
			}
		}
		return nil
	})
	return found, snap
}

func (r Rollouts) DeleteSnapshot(ctx context.Context, req *connect.Request[corralv1.DeleteSnapshotRequest]) (*connect.Response[corralv1.DeleteSnapshotResponse], error) {
	return onHolder(r.P, req.Msg.SnapshotId, func(c corralv1connect.RolloutServiceClient) (*connect.Response[corralv1.DeleteSnapshotResponse], error) {
		return c.DeleteSnapshot(ctx, connect.NewRequest(req.Msg))
	})
}

// onHolder calls fn on every node and returns the one answer that is not
// NotFound. With none, the snapshot is NotFound if every node answered,
// and Unavailable naming the nodes that did not otherwise (one of them
// may hold it).
func onHolder[Resp any](p *Proxy, id string, fn func(corralv1connect.RolloutServiceClient) (*connect.Response[Resp], error)) (*connect.Response[Resp], error) {
	var (
		mu     sync.Mutex
		answer *connect.Response[Resp]
		failed error
	)
	nf, err := fanOut(p, func(_ *NodeView, c corralv1connect.RolloutServiceClient) error {
		resp, err := fn(c)
		if connect.CodeOf(err) == connect.CodeNotFound {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			answer = resp
		case failed == nil && connect.CodeOf(err) != connect.CodeUnavailable:
			failed = err // the holder's own refusal (quota, precondition)
			return nil
		}
		return err
	})
	switch {
	case err != nil:
		return nil, err
	case answer != nil:
		return answer, nil
	case failed != nil:
		return nil, failed
	case len(nf) > 0:
		var names []string
		for _, f := range nf {
			names = append(names, fmt.Sprintf("%s (%s)", f.NodeId, f.Error))
		}
		return nil, errdefs.Unavailable("snapshot %s: not on the nodes that answered; could not ask %s", id, strings.Join(names, ", "))
	}
	return nil, errdefs.NotFound("snapshot %s not found", id)
}
