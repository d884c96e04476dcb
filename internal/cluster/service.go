package cluster

import (
	"context"
	"slices"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
)

// Service is a control instance's ClusterService: the watcher's view of
// the nodes, and draining.
type Service struct {
	W *Watcher
}

var _ corralv1connect.ClusterServiceHandler = Service{}

// NodeToProto describes v for the API.
func NodeToProto(v *NodeView) *corralv1.Node {
	n := &corralv1.Node{
		Id: v.ID, Address: v.Address, State: string(v.State), Version: v.Version,
		Labels: v.Labels, Backends: slices.Clone(v.Backends), Reason: v.Reason,
		Capacity: &corralv1.NodeCapacity{Sandboxes: v.Capacity.Sandboxes, CpuMillis: v.Capacity.CPUMillis, MemoryBytes: v.Capacity.MemoryBytes},
		Load: &corralv1.NodeLoad{
			Sandboxes: v.Load.Sandboxes, CpuMillisCommitted: v.Load.CPUMillis, MemoryBytesCommitted: v.Load.MemoryBytes,
			Backends: v.Load.Backends, Utilisation: v.Load.Utilisation(v.Capacity),
			MemoryBytesUsed: v.Load.MemoryUsed, LoadAverage: v.Load.LoadAverage,
		},
	}
	if !v.AsOf.IsZero() {
		n.ReportedAt = timestamppb.New(v.AsOf)
	}
	return n
}

func (s Service) ListNodes(_ context.Context, _ *connect.Request[corralv1.ListNodesRequest]) (*connect.Response[corralv1.ListNodesResponse], error) {
	out := &corralv1.ListNodesResponse{}
	for _, v := range s.W.Snapshot().Nodes {
		out.Nodes = append(out.Nodes, NodeToProto(v))
	}
	return connect.NewResponse(out), nil
}

func (s Service) DrainNode(ctx context.Context, req *connect.Request[corralv1.DrainNodeRequest]) (*connect.Response[corralv1.DrainNodeResponse], error) {
	id := req.Msg.Id
	if s.W.Snapshot().Node(id) == nil {
		return nil, errdefs.NotFound("node %s: not in the cluster", id)
	}
	if err := s.W.Drain(ctx, id, !req.Msg.Undrain); err != nil {
		return nil, err
	}
	want := NodeDrained
	if req.Msg.Undrain {
		want = NodeReady
	}
	// Answer once this instance's own view shows the change.
	_ = s.W.WaitFor(ctx, func(sn *Snapshot) bool { v := sn.Node(id); return v == nil || v.State == want || v.State == NodeLost })
	return connect.NewResponse(&corralv1.DrainNodeResponse{Node: NodeToProto(s.W.Snapshot().Node(id))}), nil
}
