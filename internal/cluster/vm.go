package cluster

import (
	"context"
	"net"
	"net/http"
	"slices"
	"strings"

	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/liveview"
)

// NodeVMs is a VMService client of node v (screens and VM images are a
// node's own).
func (p *Proxy) NodeVMs(v *NodeView) corralv1connect.VMServiceClient {
	return corralv1connect.NewVMServiceClient(p.http, p.url(v), p.signed())
}

// NodeOf is the node owning sandbox id: NotFound naming the node when the
// cluster never had it, Unavailable when it is lost.
func (p *Proxy) NodeOf(id string) (*NodeView, error) {
	v, _, err := p.nodeFor(id)
	return v, err
}

// VMNodes are the ready nodes that run the vm backend.
func (p *Proxy) VMNodes() []*NodeView {
	var out []*NodeView
	for _, v := range p.cfg.Watcher.Snapshot().Nodes {
		if v.State == NodeReady && slices.Contains(v.Backends, "vm") {
			out = append(out, v)
		}
	}
	return out
}

// VMNode is the node a VM image call names, or the only node running the
// vm backend when it names none (images are each node's own, so the
// caller must say which when there are several).
func (p *Proxy) VMNode(node string) (*NodeView, error) {
	if node != "" {
		v := p.cfg.Watcher.Snapshot().Node(node)
		switch {
		case v == nil:
			return nil, errdefs.NotFound("node %s: not in the cluster", node)
		case v.State != NodeReady:
			return nil, errdefs.Unavailable("node %s: %s %s", node, v.State, v.Reason)
		case !slices.Contains(v.Backends, "vm"):
			return nil, errdefs.FailedPrecondition("node %s: runs no vm backend (has %s)", node, strings.Join(v.Backends, ", "))
		}
		return v, nil
	}
	vs := p.VMNodes()
	switch len(vs) {
	case 0:
		return nil, errdefs.Unavailable("the cluster has no ready node running the vm backend")
	case 1:
		return vs[0], nil
	}
	ids := make([]string, len(vs))
	for i, v := range vs {
		ids[i] = v.ID
	}
	return nil, errdefs.InvalidArgument("node: required: VM images are each node's own and %d nodes run the vm backend (%s)", len(vs), strings.Join(ids, ", "))
}

// OpenLiveView forwards a viewer to the live view endpoint of the node
// owning sandbox, on its cluster listener (signed as every control→node
// call); the node checks the token.
func (p *Proxy) OpenLiveView(ctx context.Context, sandbox, token string) (net.Conn, error) {
	v, err := p.NodeOf(sandbox)
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	p.cfg.Secret.sign(h, liveview.Path(sandbox), iam.Principal{})
	var tlsConfig = p.http.Transport.(*http.Transport).TLSClientConfig
	return liveview.DialNode(ctx, p.scheme, v.Address, tlsConfig, h, sandbox, token)
}
