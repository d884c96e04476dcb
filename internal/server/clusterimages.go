package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/control"
	"github.com/corral-dev/corral/internal/errdefs"
	image "github.com/corral-dev/corral/internal/storage/layers"
	layershare "github.com/corral-dev/corral/internal/storage/share"
)

// Image records of a cluster live in etcd (outside the prefix the node
// watcher follows); their data is in the shared blob store.
const (
	layerRecords       = "/corral/images/layers/"
	compositionRecords = "/corral/images/compositions/"
	// removingRecords marks a NAME@VERSION being removed from the cluster
	// (under a lease, in case its control instance dies): while it is
	// there no node records the name or pulls it.
	removingRecords = "/corral/images/removing/"
)

// removingTTL bounds how long a removal whose control instance died
// keeps its name from being recorded or pulled.
const removingTTL = 10 * 60 // seconds

// layerRecord names a layer published to the blob store.
type layerRecord struct {
	image.Layer
	Node string `json:"node"`
}

type compositionRecord struct {
	image.Composition
	Node string `json:"node"`
}

// clusterImages shares a node's layers and compositions with the cluster
// and fetches, on a create, those it lacks.
type clusterImages struct {
	etcd   *clientv3.Client
	images *image.Store
	share  *layershare.Share
	node   string
	log    *slog.Logger
	// mu orders the node's removal of an image (write) against its record
	// sync and its pulls (read): a sync or a pull that began before the
	// removal reached this node ends before it, so nothing listed or
	// pulled before the removal is recorded or kept after it.
	mu sync.RWMutex
}

// sync records every split layer and every composition of the node that
// the cluster does not know by that name yet (first come, first kept: a
// name is immutable).
func (ci *clusterImages) sync(ctx context.Context) error {
	ci.mu.RLock()
	defer ci.mu.RUnlock()
	layers, err := ci.images.Layers(ctx)
	if err != nil {
		return err
	}
	comps, err := ci.images.Compositions(ctx)
	if err != nil {
		return err
	}
	var ops []clientv3.Op
	var cmps [][]clientv3.Cmp
	put := func(key, ref string, v any) {
		b, _ := json.Marshal(v)
		cmps = append(cmps, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(removingRecords+ref), "=", 0)})
		ops = append(ops, clientv3.OpPut(key, string(b)))
	}
	known, err := ci.etcd.Get(ctx, "/corral/images/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("cluster images: %w", err)
	}
	have := map[string]bool{}
	for _, kv := range known.Kvs {
		have[string(kv.Key)] = true
	}
	for _, l := range layers {
		if l.Split() && !have[layerRecords+l.Ref] {
			put(layerRecords+l.Ref, l.Ref, layerRecord{Layer: l, Node: ci.node})
		}
	}
	for _, c := range comps {
		if !have[compositionRecords+c.Ref] {
			put(compositionRecords+c.Ref, c.Ref, compositionRecord{Composition: c, Node: ci.node})
		}
	}
	// One key per transaction: another node recording the same name first,
	// or a removal of the name in progress, only makes that one write a
	// no-op.
	for i := range ops {
		if _, err := ci.etcd.Txn(ctx).If(cmps[i]...).Then(ops[i]).Commit(); err != nil {
			return fmt.Errorf("cluster images: record: %w", err)
		}
	}
	return nil
}

func (ci *clusterImages) run(ctx context.Context, every time.Duration) {
	for {
		if err := ci.sync(ctx); err != nil && ctx.Err() == nil {
			ci.log.Warn("share image records", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// puller returns a function that pulls a layer another node recorded
// (metadata only; the blob is read lazily) unless the node has it; name
// is the image it is pulled for, in errors.
func (ci *clusterImages) puller(ctx context.Context, name string) (func(ref string) error, error) {
	local := map[string]bool{}
	layers, err := ci.images.Layers(ctx)
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		local[l.Ref] = true
	}
	return func(ref string) error {
		if local[ref] {
			return nil
		}
		resp, err := ci.etcd.Get(ctx, layerRecords+ref)
		if err != nil {
			return errdefs.Unavailable("image %s: layer records: %v", name, err)
		}
		if len(resp.Kvs) == 0 {
			return errdefs.NotFound("image %s: layer %s is on no node of the cluster", name, ref)
		}
		var rec layerRecord
		if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
			return fmt.Errorf("layer record %s: %w", ref, err)
		}
		ci.log.Info("pulling a layer recorded by another node", "ref", ref, "digest", rec.Digest, "from", rec.Node)
		_, err = ci.share.Pull(ctx, ci.images, rec.Digest, ref)
		if err == nil {
			local[ref] = true
		}
		return err
	}, nil
}

// prepare makes the image a create names available on this node: a
// composition or layer another node recorded is pulled (metadata only; the
// blob is read lazily) before the create goes on.
func (ci *clusterImages) prepare(ctx context.Context, req *corralv1.CreateRequest) error {
	name := req.Image
	if name == "" || !strings.Contains(name, "@") {
		return nil // defaults and built images are the node's own
	}
	if _, err := ci.images.Get(ctx, name); !errdefs.IsNotFound(err) {
		return nil // here (or failing for another reason the create reports)
	}
	ci.mu.RLock()
	defer ci.mu.RUnlock()
	if err := ci.notRemoving(ctx, name); err != nil {
		return err
	}
	pull, err := ci.puller(ctx, name)
	if err != nil {
		return err
	}
	resp, err := ci.etcd.Get(ctx, compositionRecords+name)
	if err != nil {
		return errdefs.Unavailable("image %s: composition records: %v", name, err)
	}
	if len(resp.Kvs) == 0 {
		return pull(name) // a layer of its own
	}
	var rec compositionRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return fmt.Errorf("composition record %s: %w", name, err)
	}
	for _, ref := range rec.Layers {
		if !strings.Contains(ref, "@") {
			return errdefs.FailedPrecondition("image %s: layer %q follows its name's latest version, which only the node that made it resolves; pin a version", name, ref)
		}
		if err := pull(ref); err != nil {
			return err
		}
	}
	_, err = ci.images.CreateComposition(ctx, rec.Composition)
	if errdefs.IsAlreadyExists(err) {
		err = nil
	}
	return err
}

// notRemoving fails while name is being removed from the cluster.
func (ci *clusterImages) notRemoving(ctx context.Context, name string) error {
	resp, err := ci.etcd.Get(ctx, removingRecords+name, clientv3.WithCountOnly())
	if err != nil {
		return errdefs.Unavailable("image %s: cluster records: %v", name, err)
	}
	if resp.Count > 0 {
		return errdefs.FailedPrecondition("image %s: being removed from the cluster", name)
	}
	return nil
}

// ClusterImageService is a control instance's ImageService: the cluster's
// layers and compositions from etcd; Pack on the sandbox's node; builds
// from a stream (UploadLayer, UploadImage), registry imports and new
// compositions on any ready node, which records the result for the
// cluster; RemoveImage on every node and in etcd. The calls that read a
// node's paths or manage one node's store (CreateLayer from a path,
// PullLayer, CollectGarbage) are refused: run them on that node.
type ClusterImageService struct {
	corralv1connect.UnimplementedImageServiceHandler
	etcd  *clientv3.Client
	proxy *cluster.Proxy
}

func (s ClusterImageService) Pack(ctx context.Context, req *connect.Request[corralv1.PackRequest]) (*connect.Response[corralv1.PackResponse], error) {
	c, err := s.proxy.ImagesFor(req.Msg.SandboxId)
	if err != nil {
		return nil, err
	}
	return c.Pack(ctx, connect.NewRequest(req.Msg))
}

// anyNode is the node a build or import runs on, with an ImageService
// client of it.
func (s ClusterImageService) anyNode() (*cluster.NodeView, corralv1connect.ImageServiceClient, error) {
	v, err := s.proxy.AnyNode()
	if err != nil {
		return nil, nil, err
	}
	return v, s.proxy.NodeImages(v), nil
}

// onAnyNode makes call of any node; the node's errors name it.
func onAnyNode[Resp any](s ClusterImageService, call func(corralv1connect.ImageServiceClient) (*connect.Response[Resp], error)) (*connect.Response[Resp], error) {
	v, c, err := s.anyNode()
	if err != nil {
		return nil, err
	}
	resp, err := call(c)
	return resp, onNode(v, err)
}

func (s ClusterImageService) CreateComposition(ctx context.Context, req *connect.Request[corralv1.CreateCompositionRequest]) (*connect.Response[corralv1.CreateCompositionResponse], error) {
	return onAnyNode(s, func(c corralv1connect.ImageServiceClient) (*connect.Response[corralv1.CreateCompositionResponse], error) {
		return c.CreateComposition(ctx, connect.NewRequest(req.Msg))
	})
}

func (s ClusterImageService) UploadLayer(ctx context.Context, in *connect.ClientStream[corralv1.UploadLayerRequest]) (*connect.Response[corralv1.CreateLayerResponse], error) {
	return onAnyNode(s, func(c corralv1connect.ImageServiceClient) (*connect.Response[corralv1.CreateLayerResponse], error) {
		return relayUpload(in, c.UploadLayer(ctx))
	})
}

func (s ClusterImageService) UploadImage(ctx context.Context, in *connect.ClientStream[corralv1.UploadImageRequest]) (*connect.Response[corralv1.ImportResult], error) {
	return onAnyNode(s, func(c corralv1connect.ImageServiceClient) (*connect.Response[corralv1.ImportResult], error) {
		return relayUpload(in, c.UploadImage(ctx))
	})
}

func (s ClusterImageService) ImportImage(ctx context.Context, req *connect.Request[corralv1.ImportImageRequest], out *connect.ServerStream[corralv1.ImportImageResponse]) error {
	if src := req.Msg.Source; strings.HasPrefix(src, image.SourceOCILayout) || strings.HasPrefix(src, image.SourceDockerArchive) {
		return errdefs.InvalidArgument("source: %q names a path on a node, which a control instance does not read; send the archive from the client instead (the CLI and SDKs stream it)", src)
	}
	v, c, err := s.anyNode()
	if err != nil {
		return err
	}
	in, err := c.ImportImage(ctx, connect.NewRequest(req.Msg))
	return relay(v, in, err, out)
}

// relay copies node v's answer stream in (opened with err) to out; v's
// errors name it.
func relay[T any](v *cluster.NodeView, in *connect.ServerStreamForClient[T], err error, out *connect.ServerStream[T]) error {
	if err != nil {
		return onNode(v, err)
	}
	return cluster.Relay(in, out, func(err error) error { return onNode(v, err) })
}

// RemoveImage removes NAME@VERSION (a composition and/or a layer) from
// every node that has it, then the cluster's records of it, so no node
// pulls it again. A lost node might still have it: nothing is removed
// while one is. A layer in use on a node fails there (FailedPrecondition
// naming the node); the nodes before it have removed theirs, and the
// records stay until a repeat succeeds everywhere.
func (s ClusterImageService) RemoveImage(ctx context.Context, req *connect.Request[corralv1.RemoveImageRequest]) (*connect.Response[corralv1.RemoveImageResponse], error) {
	name := req.Msg.Name
	if !strings.Contains(name, "@") {
		return nil, errdefs.InvalidArgument("name: %q: the cluster's images are NAME@VERSION (a built image NAME is one node's: remove it there)", name)
	}
	snap := s.proxy.Nodes()
	var nodes []imageRemover
	for _, v := range snap.Nodes {
		if v.State == cluster.NodeLost {
			return nil, errdefs.Unavailable("remove %s: %s, and may have it", name, v.Reason)
		}
		nodes = append(nodes, imageRemover{node: v.ID, remove: s.proxy.NodeImages(v).RemoveImage})
	}
	removed, err := removeFromCluster(ctx, s.etcd, req.Msg, nodes)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.RemoveImageResponse{Removed: removed}), nil
}

// imageRemover removes an image from one node.
type imageRemover struct {
	node   string
	remove func(context.Context, *connect.Request[corralv1.RemoveImageRequest]) (*connect.Response[corralv1.RemoveImageResponse], error)
}

// removeFromCluster removes req.Name from each of nodes, then its records.
// The name is marked as being removed first, until the end: meanwhile no
// node records it (a sync that listed it before its node removed it, or
// a node that still has it) and no node pulls it (a create from it on a
// node the removal already passed), so it cannot come back.
func removeFromCluster(ctx context.Context, etcd *clientv3.Client, req *corralv1.RemoveImageRequest, nodes []imageRemover) (*corralv1.Removed, error) {
	name := req.Name
	lease, err := etcd.Grant(ctx, removingTTL)
	if err != nil {
		return nil, errdefs.Unavailable("remove %s: cluster records: %v", name, err)
	}
	// Revoking the lease drops the mark, also when the removal failed.
	defer func() { _, _ = etcd.Revoke(context.WithoutCancel(ctx), lease.ID) }()
	if _, err := etcd.Put(ctx, removingRecords+name, "", clientv3.WithLease(lease.ID)); err != nil {
		return nil, errdefs.Unavailable("remove %s: cluster records: %v", name, err)
	}
	removed := &corralv1.Removed{}
	found := false
	for _, n := range nodes {
		resp, err := n.remove(ctx, connect.NewRequest(req))
		if connect.CodeOf(err) == connect.CodeNotFound || errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, onNodeID(n.node, err)
		}
		found = true
		r := resp.Msg.Removed
		removed.Images = append(removed.Images, r.GetImages()...)
		removed.Compositions = append(removed.Compositions, r.GetCompositions()...)
		removed.Layers = append(removed.Layers, r.GetLayers()...)
		removed.Deleted = append(removed.Deleted, r.GetDeleted()...)
		removed.FreedBytes += r.GetFreedBytes()
	}
	del, err := etcd.Txn(ctx).Then(clientv3.OpDelete(layerRecords+name), clientv3.OpDelete(compositionRecords+name)).Commit()
	if err != nil {
		return nil, errdefs.Unavailable("remove %s: cluster records: %v", name, err)
	}
	for _, r := range del.Responses {
		found = found || r.GetResponseDeleteRange().GetDeleted() > 0
	}
	if !found {
		return nil, errdefs.NotFound("image %s: on no node of the cluster", name)
	}
	return removed, nil
}

func (ClusterImageService) CreateLayer(context.Context, *connect.Request[corralv1.CreateLayerRequest]) (*connect.Response[corralv1.CreateLayerResponse], error) {
	return nil, errdefs.NotSupported("create layer: path names a directory on a node; at a control instance send the tree instead (corral layer create streams it) or run it on that node")
}

func (ClusterImageService) PullLayer(context.Context, *connect.Request[corralv1.PullLayerRequest]) (*connect.Response[corralv1.PullLayerResponse], error) {
	return nil, errdefs.NotSupported("pull layer: the cluster's layers are pulled by each node when a create needs them; run it on a node to pull one ahead")
}

func (ClusterImageService) CollectGarbage(context.Context, *connect.Request[corralv1.CollectGarbageRequest]) (*connect.Response[corralv1.CollectGarbageResponse], error) {
	return nil, errdefs.NotSupported("collect garbage: each node collects its own store; run it on the node's socket")
}

// onNode names the node a routed image call failed on.
func onNode(v *cluster.NodeView, err error) error { return onNodeID(v.ID, err) }

func onNodeID(node string, err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return connect.NewError(ce.Code(), fmt.Errorf("node %s: %s", node, ce.Message()))
	}
	return fmt.Errorf("node %s: %w", node, err)
}

// relayUpload forwards a client stream to a node message by message and
// returns the node's answer.
func relayUpload[Req, Resp any](in *connect.ClientStream[Req], out *connect.ClientStreamForClient[Req, Resp]) (*connect.Response[Resp], error) {
	for in.Receive() {
		if err := out.Send(in.Msg()); err != nil {
			break // the node answered early: CloseAndReceive has its answer
		}
	}
	if err := in.Err(); err != nil {
		_, _ = out.CloseAndReceive()
		return nil, err
	}
	resp, err := out.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp.Msg), nil
}

// nodeImages is the ImageService a node serves control instances: Pack,
// builds from a stream, registry imports, compositions and removal, each
// recorded for the cluster (or its record dropped) at once. The calls that
// read node paths or manage the node's whole store are its administrator's,
// on its socket. Without a blob store nothing built here could travel:
// only Pack and RemoveImage are served then.
type nodeImages struct {
	corralv1connect.UnimplementedImageServiceHandler
	inner *control.ImageService
	ci    *clusterImages // nil without a blob store
}

// recorded syncs the node's images to the cluster's records after a
// successful change.
func (n nodeImages) recorded(ctx context.Context, err error) {
	if err == nil && n.ci != nil {
		if serr := n.ci.sync(ctx); serr != nil {
			n.ci.log.Warn("record images for the cluster (retried)", "err", serr)
		}
	}
}

func (n nodeImages) shared(what string) error {
	if n.ci == nil {
		return errdefs.FailedPrecondition("%s: this node has no shared blob store (--blob-store): what it built would be usable only here", what)
	}
	return nil
}

func (n nodeImages) Pack(ctx context.Context, req *connect.Request[corralv1.PackRequest]) (*connect.Response[corralv1.PackResponse], error) {
	resp, err := n.inner.Pack(ctx, req)
	n.recorded(ctx, err)
	return resp, err
}

func (n nodeImages) RemoveImage(ctx context.Context, req *connect.Request[corralv1.RemoveImageRequest]) (*connect.Response[corralv1.RemoveImageResponse], error) {
	if n.ci != nil {
		n.ci.mu.Lock()
		defer n.ci.mu.Unlock()
	}
	return n.inner.RemoveImage(ctx, req)
}

// upload serves an upload of what on a node whose images are shared, and
// records what it made.
func upload[Req, Resp any](n nodeImages, ctx context.Context, what string, in *connect.ClientStream[Req],
	call func(*control.ImageService, context.Context, *connect.ClientStream[Req]) (*connect.Response[Resp], error)) (*connect.Response[Resp], error) {
	if err := n.shared(what); err != nil {
		return nil, err
	}
	resp, err := call(n.inner, ctx, in)
	n.recorded(ctx, err)
	return resp, err
}

func (n nodeImages) UploadLayer(ctx context.Context, in *connect.ClientStream[corralv1.UploadLayerRequest]) (*connect.Response[corralv1.CreateLayerResponse], error) {
	return upload(n, ctx, "upload layer", in, (*control.ImageService).UploadLayer)
}

func (n nodeImages) UploadImage(ctx context.Context, in *connect.ClientStream[corralv1.UploadImageRequest]) (*connect.Response[corralv1.ImportResult], error) {
	return upload(n, ctx, "upload image", in, (*control.ImageService).UploadImage)
}

func (n nodeImages) ImportImage(ctx context.Context, req *connect.Request[corralv1.ImportImageRequest], out *connect.ServerStream[corralv1.ImportImageResponse]) error {
	if err := n.shared("import image"); err != nil {
		return err
	}
	err := n.inner.ImportImage(ctx, req, out)
	n.recorded(ctx, err)
	return err
}

// CreateComposition pulls the layers the composition names that other
// nodes recorded, then records it here and for the cluster.
func (n nodeImages) CreateComposition(ctx context.Context, req *connect.Request[corralv1.CreateCompositionRequest]) (*connect.Response[corralv1.CreateCompositionResponse], error) {
	if err := n.shared("create composition"); err != nil {
		return nil, err
	}
	c := req.Msg.GetComposition()
	pull, err := n.ci.puller(ctx, c.GetRef())
	if err != nil {
		return nil, err
	}
	for i, ref := range c.GetLayers() {
		if !strings.Contains(ref, "@") {
			return nil, errdefs.InvalidArgument("composition.layers[%d]: %q must pin a version (NAME@VERSION) to be usable on every node", i, ref)
		}
		if err := pull(ref); err != nil {
			return nil, fmt.Errorf("composition.layers[%d]: %w", i, err)
		}
	}
	resp, err := n.inner.CreateComposition(ctx, req)
	n.recorded(ctx, err)
	return resp, err
}

func (s ClusterImageService) ListImages(ctx context.Context, _ *connect.Request[corralv1.ListImagesRequest]) (*connect.Response[corralv1.ListImagesResponse], error) {
	resp, err := s.etcd.Get(ctx, "/corral/images/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, errdefs.Unavailable("cluster images: %v", err)
	}
	out := &corralv1.ListImagesResponse{}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		switch {
		case strings.HasPrefix(key, layerRecords):
			var r layerRecord
			if json.Unmarshal(kv.Value, &r) == nil {
				out.Layers = append(out.Layers, &corralv1.Layer{Ref: r.Ref, Digest: r.Digest, MetaSize: r.MetaSize, BlobDigest: r.BlobDigest, BlobSize: r.BlobSize})
			}
		case strings.HasPrefix(key, compositionRecords):
			var r compositionRecord
			if json.Unmarshal(kv.Value, &r) == nil {
				out.Compositions = append(out.Compositions, &corralv1.Composition{Ref: r.Ref, Layers: r.Layers, Env: r.Env})
			}
		}
	}
	return connect.NewResponse(out), nil
}
