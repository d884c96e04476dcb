package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/control"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/image"
	"github.com/corral-dev/corral/internal/layershare"
)

// Image records of a cluster live in etcd (outside the prefix the node
// watcher follows); their data is in the shared blob store.
const (
	layerRecords       = "/corral/images/layers/"
	compositionRecords = "/corral/images/compositions/"
)

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
}

// sync records every split layer and every composition of the node that
// the cluster does not know by that name yet (first come, first kept: a
// name is immutable).
func (ci *clusterImages) sync(ctx context.Context) error {
	layers, err := ci.images.Layers(ctx)
	if err != nil {
		return err
	}
	comps, err := ci.images.Compositions(ctx)
	if err != nil {
		return err
	}
	var ops []clientv3.Op
	var cmps []clientv3.Cmp
	put := func(key string, v any) {
		b, _ := json.Marshal(v)
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
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
			put(layerRecords+l.Ref, layerRecord{Layer: l, Node: ci.node})
		}
	}
	for _, c := range comps {
		if !have[compositionRecords+c.Ref] {
			put(compositionRecords+c.Ref, compositionRecord{Composition: c, Node: ci.node})
		}
	}
	// One key per transaction: another node recording the same name first
	// only makes that one write a no-op.
	for i := range ops {
		if _, err := ci.etcd.Txn(ctx).If(cmps[i]).Then(ops[i]).Commit(); err != nil {
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
	local := map[string]bool{}
	layers, err := ci.images.Layers(ctx)
	if err != nil {
		return err
	}
	for _, l := range layers {
		local[l.Ref] = true
	}
	pull := func(ref string) error {
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

// ClusterImageService is a control instance's ImageService: the cluster's
// layers and compositions from etcd, and Pack, sent to the sandbox's node.
// The methods that read node paths or change one node's store answer
// Unimplemented: run them on a node.
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

// nodePack is the ImageService a node serves control instances: Pack only
// (the other methods read node paths or manage the node's own store, which
// only its administrator does, on its socket). The packed layer and
// composition are recorded for the cluster at once.
type nodePack struct {
	corralv1connect.UnimplementedImageServiceHandler
	inner *control.ImageService
	ci    *clusterImages // nil without a blob store
}

func (n nodePack) Pack(ctx context.Context, req *connect.Request[corralv1.PackRequest]) (*connect.Response[corralv1.PackResponse], error) {
	resp, err := n.inner.Pack(ctx, req)
	if err == nil && n.ci != nil {
		if serr := n.ci.sync(ctx); serr != nil {
			n.ci.log.Warn("record the packed layer for the cluster (retried)", "err", serr)
		}
	}
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
