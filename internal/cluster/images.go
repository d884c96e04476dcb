package cluster

import (
	"math/rand/v2"

	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
)

// NodeImages is an ImageService client of node v (the image calls a node
// serves control instances).
func (p *Proxy) NodeImages(v *NodeView) corralv1connect.ImageServiceClient {
	return corralv1connect.NewImageServiceClient(p.http, p.url(v), p.signed())
}

// AnyNode is a random ready node (image builds and imports run there;
// the result is recorded for the whole cluster).
func (p *Proxy) AnyNode() (*NodeView, error) {
	var ready []*NodeView
	for _, v := range p.cfg.Watcher.Snapshot().Nodes {
		if v.State == NodeReady {
			ready = append(ready, v)
		}
	}
	if len(ready) == 0 {
		return nil, errdefs.Unavailable("the cluster has no ready node")
	}
	return ready[rand.IntN(len(ready))], nil
}

// Nodes is the current view of the cluster's nodes.
func (p *Proxy) Nodes() *Snapshot { return p.cfg.Watcher.Snapshot() }
