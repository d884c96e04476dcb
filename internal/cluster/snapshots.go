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
	var mu sync.Mutex
	nf, err := fanOut(r.P, func(_ *NodeView, c corralv1connect.RolloutServiceClient) error {
		resp, err := c.ListSnapshots(ctx, connect.NewRequest(req.Msg))
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		out.Snapshots = append(out.Snapshots, resp.Msg.Snapshots...)
		return nil
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

// Restore makes the new sandbox on the snapshot's node, which admits it
// against its capacity and the project's quota.
func (r Rollouts) Restore(ctx context.Context, req *connect.Request[corralv1.RestoreRequest]) (*connect.Response[corralv1.RestoreResponse], error) {
	return onHolder(r.P, req.Msg.SnapshotId, func(c corralv1connect.RolloutServiceClient) (*connect.Response[corralv1.RestoreResponse], error) {
		return c.Restore(ctx, connect.NewRequest(req.Msg))
	})
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
