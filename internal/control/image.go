package control

import (
	"context"
	"sync"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/importroot"
	"github.com/corral-dev/corral/internal/node"
	image "github.com/corral-dev/corral/internal/storage/layers"
	layershare "github.com/corral-dev/corral/internal/storage/share"
)

// ImageService implements corral.v1.ImageService over the local node's
// image store; Pack is routed to the node owning the sandbox.
type ImageService struct {
	sandboxes *Service
	images    *image.Store
	share     *layershare.Share // nil: no blob store
	// importRoot is where node paths may lie (nil: nowhere).
	importRoot *importroot.Root
}

var _ corralv1connect.ImageServiceHandler = (*ImageService)(nil)

// NewImageService serves images and routes Pack through sandboxes.
// share (nil without a blob store) pulls layers and reports lazy figures.
func NewImageService(sandboxes *Service, images *image.Store, share *layershare.Share) *ImageService {
	return &ImageService{sandboxes: sandboxes, images: images, share: share}
}

func (s *ImageService) PullLayer(ctx context.Context, req *connect.Request[corralv1.PullLayerRequest]) (*connect.Response[corralv1.PullLayerResponse], error) {
	if s.share == nil {
		return nil, errdefs.FailedPrecondition("pull: this node has no blob store (corral serve --blob-store)")
	}
	if req.Msg.Digest == "" {
		return nil, errdefs.InvalidArgument("digest: required (a layer digest sha256:<hex>)")
	}
	l, err := s.share.Pull(ctx, s.images, req.Msg.Digest, req.Msg.Name)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.PullLayerResponse{Layer: s.withLazy(ctx, layerToProto(l))}), nil
}

// withLazy adds the lazy figures of l's blob when the node reads it lazily.
func (s *ImageService) withLazy(ctx context.Context, l *corralv1.Layer) *corralv1.Layer {
	if s.share == nil || l.BlobDigest == "" {
		return l
	}
	st, ok, err := s.share.Stats(ctx, l.BlobDigest)
	if err != nil || !ok {
		return l
	}
	l.Lazy = &corralv1.LazyBlobStats{
		BytesFetched: st.BytesFetched, BytesPresent: st.BytesPresent,
		ChunksPresent: int32(st.ChunksPresent), ChunksTotal: int32(st.ChunksTotal), ChunkSize: st.ChunkSize,
		HitRate: st.HitRate, FailedFetches: st.FailedFetches, CorruptChunks: st.CorruptChunks,
	}
	if st.Fault != nil {
		l.Lazy.Fault = st.Fault.Reason
	}
	return l
}

func (s *ImageService) ListImages(ctx context.Context, _ *connect.Request[corralv1.ListImagesRequest]) (*connect.Response[corralv1.ListImagesResponse], error) {
	imgs, err := s.images.List(ctx)
	if err != nil {
		return nil, err
	}
	comps, err := s.images.Compositions(ctx)
	if err != nil {
		return nil, err
	}
	layers, err := s.images.Layers(ctx)
	if err != nil {
		return nil, err
	}
	out := &corralv1.ListImagesResponse{Layers: layersToProto(layers)}
	for _, l := range out.Layers {
		s.withLazy(ctx, l)
	}
	for _, img := range imgs {
		out.Images = append(out.Images, &corralv1.BuiltImage{Name: img.Name, Layers: layersToProto(img.Stack), Env: img.Env})
	}
	for _, c := range comps {
		out.Compositions = append(out.Compositions, compositionToProto(c))
	}
	return connect.NewResponse(out), nil
}

func (s *ImageService) CreateLayer(ctx context.Context, req *connect.Request[corralv1.CreateLayerRequest]) (*connect.Response[corralv1.CreateLayerResponse], error) {
	if req.Msg.Path == "" {
		return nil, errdefs.InvalidArgument("path: required")
	}
	l, err := s.createLayerFromNode(ctx, req.Msg.Name, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.CreateLayerResponse{Layer: layerToProto(l)}), nil
}

func (s *ImageService) CreateComposition(ctx context.Context, req *connect.Request[corralv1.CreateCompositionRequest]) (*connect.Response[corralv1.CreateCompositionResponse], error) {
	c := req.Msg.Composition
	if c == nil {
		return nil, errdefs.InvalidArgument("composition: required")
	}
	got, err := s.images.CreateComposition(ctx, image.Composition{Ref: c.Ref, Layers: c.Layers, Env: c.Env})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.CreateCompositionResponse{Composition: compositionToProto(got)}), nil
}

func (s *ImageService) ImportImage(ctx context.Context, req *connect.Request[corralv1.ImportImageRequest], stream *connect.ServerStream[corralv1.ImportImageResponse]) error {
	if req.Msg.Source == "" {
		return errdefs.InvalidArgument("source: required")
	}
	var sendErr error
	progress := func(p image.ImportProgress) {
		if sendErr != nil {
			return // the client went away: the import ends with ctx
		}
		sendErr = stream.Send(&corralv1.ImportImageResponse{Event: &corralv1.ImportImageResponse_Progress{
			Progress: &corralv1.ImportProgress{Layer: int32(p.Layer), Layers: int32(p.Layers), Bytes: p.Bytes, Cached: p.Cached}}})
	}
	opts := image.ImportOptions{Source: req.Msg.Source, Ref: req.Msg.Name, Insecure: req.Msg.Insecure, Progress: progress}
	res, fromNode, err := s.importFromNode(ctx, opts)
	if !fromNode {
		res, err = s.images.Import(ctx, opts)
	}
	if err != nil {
		return err
	}
	return stream.Send(&corralv1.ImportImageResponse{Event: &corralv1.ImportImageResponse_Result{Result: &corralv1.ImportResult{
		Composition: compositionToProto(res.Composition), ImageDigest: res.ImageDigest,
		Layers: layersToProto(res.Layers), Cached: res.Cached}}})
}

// settleWait bounds how long an image removal waits for the teardowns of
// sandboxes deleted just before it (a teardown that takes longer leaves
// its image in use, and the removal says so).
const settleWait = 10 * time.Second

// settle waits for the background halves of earlier Deletes on the local
// node, so that their image pins are gone before an image is removed.
func (s *Service) settle(ctx context.Context) {
	if s == nil || s.local == nil {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, settleWait)
	defer cancel()
	_ = s.local.Settle(sctx)
}

func (s *ImageService) RemoveImage(ctx context.Context, req *connect.Request[corralv1.RemoveImageRequest]) (*connect.Response[corralv1.RemoveImageResponse], error) {
	s.sandboxes.settle(ctx)
	rm, err := s.images.Remove(ctx, req.Msg.Name)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.RemoveImageResponse{Removed: removedToProto(rm)}), nil
}

func (s *ImageService) CollectGarbage(ctx context.Context, _ *connect.Request[corralv1.CollectGarbageRequest]) (*connect.Response[corralv1.CollectGarbageResponse], error) {
	s.sandboxes.settle(ctx)
	rm, err := s.images.GC(ctx)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.CollectGarbageResponse{Removed: removedToProto(rm)}), nil
}

func (s *ImageService) Pack(ctx context.Context, req *connect.Request[corralv1.PackRequest]) (*connect.Response[corralv1.PackResponse], error) {
	n, err := s.sandboxes.route(req.Msg.SandboxId)
	if err != nil {
		return nil, err
	}
	res, err := n.Pack(ctx, node.PackRequest{
		ID: req.Msg.SandboxId,
		PackOptions: image.PackOptions{Ref: req.Msg.Name, Exclude: req.Msg.Exclude,
			NoDefaultExcludes: req.Msg.NoDefaultExcludes},
		NoComposition: req.Msg.NoComposition,
	})
	if err != nil {
		return nil, err
	}
	out := &corralv1.PackResponse{Layer: layerToProto(res.Layer)}
	if res.Composition.Ref != "" {
		out.Composition = compositionToProto(res.Composition)
	}
	return connect.NewResponse(out), nil
}

func layerToProto(l image.Layer) *corralv1.Layer {
	return &corralv1.Layer{Ref: l.Ref, Digest: l.Digest, MetaSize: l.MetaSize, BlobDigest: l.BlobDigest, BlobSize: l.BlobSize}
}

func layersToProto(ls []image.Layer) []*corralv1.Layer {
	out := make([]*corralv1.Layer, len(ls))
	for i, l := range ls {
		out[i] = layerToProto(l)
	}
	return out
}

func compositionToProto(c image.Composition) *corralv1.Composition {
	return &corralv1.Composition{Ref: c.Ref, Layers: c.Layers, Env: c.Env}
}

func removedToProto(rm image.Removed) *corralv1.Removed {
	return &corralv1.Removed{Images: rm.Images, Compositions: rm.Compositions, Layers: layersToProto(rm.Layers),
		Deleted: rm.Deleted, FreedBytes: rm.FreedBytes}
}

// BuildImage builds a recipe into this node's store (whatever its
// --data-dir), streaming the build's output as it comes.
func (s *ImageService) BuildImage(ctx context.Context, req *connect.Request[corralv1.BuildImageRequest], stream *connect.ServerStream[corralv1.BuildImageResponse]) error {
	if req.Msg.Name == "" {
		return errdefs.InvalidArgument("name: required (a recipe: busybox or debian)")
	}
	out := &buildOutput{stream: stream}
	build := s.images.Build
	if req.Msg.Rebuild {
		build = s.images.Rebuild
	}
	img, err := build(ctx, req.Msg.Name, out)
	if err != nil {
		return err
	}
	return out.send(&corralv1.BuildImageResponse{Event: &corralv1.BuildImageResponse_Image{Image: &corralv1.BuiltImage{
		Name: img.Name, Layers: layersToProto(img.Stack), Env: img.Env}}})
}

// buildOutput sends a build's output as stream messages. The recipe may
// write from another goroutine (a command's output copier): one Send at a
// time. A client that went away stops the messages; the build ends with
// the request's context.
type buildOutput struct {
	mu     sync.Mutex
	stream *connect.ServerStream[corralv1.BuildImageResponse]
	err    error
}

func (b *buildOutput) Write(p []byte) (int, error) {
	if err := b.send(&corralv1.BuildImageResponse{Event: &corralv1.BuildImageResponse_Output{Output: string(p)}}); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (b *buildOutput) send(m *corralv1.BuildImageResponse) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil {
		b.err = b.stream.Send(m)
	}
	return b.err
}
