package client

import (
	"context"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// Placement constrains where a cluster's control plane puts a sandbox.
type Placement struct {
	// NodeLabels must all be on the node (e.g. "gpu": "true").
	NodeLabels map[string]string
	// BurstOK lets the sandbox go to the burst pool (pool=burst nodes)
	// while the primary pool is busier than the control plane's threshold.
	BurstOK bool
	// SpreadByLabel (a key of the sandbox's Labels) puts the sandbox on
	// the node with the fewest sandboxes of the same value (anti-affinity).
	SpreadByLabel string
	// RequestID identifies the create: a retry with the same id and Retry
	// set returns the sandbox an earlier attempt made instead of a second.
	RequestID string
	Retry     bool
}

func (p Placement) toProto() *corralv1.Placement {
	if p.NodeLabels == nil && !p.BurstOK && p.RequestID == "" && !p.Retry && p.SpreadByLabel == "" {
		return nil
	}
	return &corralv1.Placement{NodeLabels: p.NodeLabels, BurstOk: p.BurstOK, RequestId: p.RequestID, Retry: p.Retry,
		SpreadByLabel: p.SpreadByLabel}
}

// Node is one node of a cluster, as a control instance sees it.
type Node struct {
	ID, Address, Version string
	// State is ready, drained or lost.
	State    string
	Reason   string
	Labels   map[string]string
	Backends []string
	// Capacity and committed load.
	CapacitySandboxes, CapacityCPUMillis, CapacityMemoryBytes int64
	Sandboxes, CPUMillis, MemoryBytes                         int64
	Utilisation                                               float64
	ReportedAt                                                time.Time
}

func nodeFromProto(n *corralv1.Node) Node {
	out := Node{ID: n.Id, Address: n.Address, Version: n.Version, State: n.State, Reason: n.Reason,
		Labels: n.Labels, Backends: n.Backends}
	if c := n.Capacity; c != nil {
		out.CapacitySandboxes, out.CapacityCPUMillis, out.CapacityMemoryBytes = c.Sandboxes, c.CpuMillis, c.MemoryBytes
	}
	if l := n.Load; l != nil {
		out.Sandboxes, out.CPUMillis, out.MemoryBytes, out.Utilisation = l.Sandboxes, l.CpuMillisCommitted, l.MemoryBytesCommitted, l.Utilisation
	}
	if n.ReportedAt != nil {
		out.ReportedAt = n.ReportedAt.AsTime()
	}
	return out
}

// ClusterNodes lists a cluster's nodes (a control instance's view).
func (c *Client) ClusterNodes(ctx context.Context) ([]Node, error) {
	resp, err := c.cluster.ListNodes(ctx, connect.NewRequest(&corralv1.ListNodesRequest{}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return fromProtos(resp.Msg.Nodes, nodeFromProto), nil
}

// DrainNode stops new placements on node id (undrain resumes them).
func (c *Client) DrainNode(ctx context.Context, id string, undrain bool) (Node, error) {
	resp, err := c.cluster.DrainNode(ctx, connect.NewRequest(&corralv1.DrainNodeRequest{Id: id, Undrain: undrain}))
	if err != nil {
		return Node{}, wrapErr(err)
	}
	return nodeFromProto(resp.Msg.Node), nil
}

// ClusterList is List's answer with what a cluster could not list.
type ClusterList struct {
	Sandboxes []*Info
	// UnavailableNodes says, per node, why its sandboxes are missing (a
	// lost or unreachable node); empty on a single node.
	UnavailableNodes []string
}

// ListCluster is List that also reports the nodes whose sandboxes could
// not be listed.
func (c *Client) ListCluster(ctx context.Context, o ListOptions) (*ClusterList, error) {
	var state corralv1.SandboxState
	for k, v := range stateFromProto {
		if v == o.State {
			state = k
		}
	}
	if o.State != "" && state == corralv1.SandboxState_SANDBOX_STATE_UNSPECIFIED {
		return nil, &Error{Code: CodeInvalidArgument, Message: "state: unknown state " + string(o.State)}
	}
	out := &ClusterList{}
	seen := map[string]bool{}
	token := ""
	for {
		resp, err := c.svc.List(ctx, connect.NewRequest(&corralv1.ListRequest{
			Labels: o.Labels, State: state, PageSize: int32(o.PageSize), PageToken: token,
		}))
		if err != nil {
			return nil, wrapErr(err)
		}
		for _, p := range resp.Msg.Sandboxes {
			out.Sandboxes = append(out.Sandboxes, infoFromProto(p))
		}
		for _, u := range resp.Msg.UnavailableNodes {
			if !seen[u] {
				seen[u] = true
				out.UnavailableNodes = append(out.UnavailableNodes, u)
			}
		}
		if token = resp.Msg.NextPageToken; token == "" {
			return out, nil
		}
	}
}
