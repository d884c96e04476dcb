package client

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// Layer is a read-only EROFS layer on the node: metadata plus a data blob.
type Layer struct {
	Ref        string // NAME@VERSION
	Digest     string
	MetaSize   int64
	BlobDigest string // empty for a single-file layer of an earlier store
	BlobSize   int64
	// Lazy is set when the node reads the blob lazily from a blob store.
	Lazy *LazyBlob
}

// LazyBlob are the lazy-loading figures of a layer's blob on a node.
type LazyBlob struct {
	BytesFetched  int64 // from the store, prefetch included
	BytesPresent  int64
	ChunksPresent int
	ChunksTotal   int
	ChunkSize     int64
	HitRate       float64 // chunk reads served from the cache / all
	FailedFetches int64
	CorruptChunks int64
	Fault         string // the last failed fetch, until one succeeds
}

// Composition is an environment: layer references, base first, each
// NAME@VERSION (pinned) or NAME (follows the latest version).
type Composition struct {
	Ref    string
	Layers []string
	Env    []string
}

// BuiltImage is an image built from a recipe (busybox, debian).
type BuiltImage struct {
	Name   string
	Layers []Layer
	Env    []string
}

// Images is what ListImages returns.
type Images struct {
	Built        []BuiltImage
	Compositions []Composition
	Layers       []Layer
}

// Removed says what RemoveImage or CollectGarbage deleted.
type Removed struct {
	Images, Compositions []string
	// Layers whose reference went; Deleted the digests whose files went.
	Layers     []Layer
	Deleted    []string
	FreedBytes int64
}

// ImportProgress is how far an import is.
type ImportProgress struct {
	Layer, Layers int // 1-based layer being converted; 0 while reading the manifest
	Bytes         int64
	Cached        bool
}

// ImportOptions configure ImportImage.
type ImportOptions struct {
	// Insecure allows a registry over plain HTTP.
	Insecure bool
	// Progress, when set, receives progress as the import advances.
	Progress func(ImportProgress)
	// NodePath: an oci: or docker-archive: source is a path on the
	// server's machine (node administrator only, under --import-root).
	NodePath bool
}

// Imported is the result of an import.
type Imported struct {
	Composition Composition
	ImageDigest string
	Layers      []Layer
	// Cached: the image had been imported before; nothing was converted.
	Cached bool
}

// PackOptions configure Pack.
type PackOptions struct {
	// Exclude are more absolute paths to leave out (* and ? match within a
	// component), besides the defaults (shell histories, /tmp, /run ...).
	Exclude []string
	// NoDefaultExcludes packs what the defaults would leave out.
	NoDefaultExcludes bool
	// NoComposition makes only the layer, not the composition of the same
	// name stacking it on the sandbox's layers.
	NoComposition bool
}

// Packed is the result of Pack.
type Packed struct {
	Layer Layer
	// Composition is the zero value with NoComposition.
	Composition Composition
}

// ListImages lists the node's built images, compositions and layers.
func (c *Client) ListImages(ctx context.Context) (*Images, error) {
	resp, err := c.img.ListImages(ctx, connect.NewRequest(&corralv1.ListImagesRequest{}))
	if err != nil {
		return nil, wrapErr(err)
	}
	out := &Images{Layers: layersFromProto(resp.Msg.Layers)}
	for _, b := range resp.Msg.Images {
		out.Built = append(out.Built, BuiltImage{Name: b.Name, Layers: layersFromProto(b.Layers), Env: b.Env})
	}
	for _, comp := range resp.Msg.Compositions {
		out.Compositions = append(out.Compositions, compositionFromProto(comp))
	}
	return out, nil
}

// CreateLayer builds the layer name (NAME@VERSION) from a directory or
// tar file at path on this machine, streamed to the server (which reads
// no path of its own: see CreateLayerFromNode).
func (c *Client) CreateLayer(ctx context.Context, path, name string) (Layer, error) {
	r, err := openLocal(ctx, path)
	if err != nil {
		return Layer{}, fmt.Errorf("layer %s: %w", name, err)
	}
	defer r.Close()
	return c.CreateLayerFromTar(ctx, r, name)
}

// CreateLayerFromNode builds the layer name from a directory or tar file
// at path on the server's machine: only the node administrator (root on
// the unix socket) may, and only under the server's --import-root.
func (c *Client) CreateLayerFromNode(ctx context.Context, path, name string) (Layer, error) {
	resp, err := c.img.CreateLayer(ctx, connect.NewRequest(&corralv1.CreateLayerRequest{Path: path, Name: name}))
	if err != nil {
		return Layer{}, wrapErr(err)
	}
	return layerFromProto(resp.Msg.Layer), nil
}

// CreateComposition records a composition.
func (c *Client) CreateComposition(ctx context.Context, comp Composition) (Composition, error) {
	resp, err := c.img.CreateComposition(ctx, connect.NewRequest(&corralv1.CreateCompositionRequest{
		Composition: &corralv1.Composition{Ref: comp.Ref, Layers: comp.Layers, Env: comp.Env}}))
	if err != nil {
		return Composition{}, wrapErr(err)
	}
	return compositionFromProto(resp.Msg.Composition), nil
}

// ImportImage imports source (a registry reference, oci:DIR[:REF] or
// docker-archive:FILE[:REPO:TAG]) as the composition name (NAME@VERSION).
// The server pulls a registry image itself; a layout or archive is read
// here and streamed (no progress is reported for it) unless o.NodePath.
func (c *Client) ImportImage(ctx context.Context, source, name string, o ImportOptions) (*Imported, error) {
	if up, ok := localArchive(source); ok && !o.NodePath {
		return c.uploadImage(ctx, up, name)
	}
	stream, err := c.img.ImportImage(ctx, connect.NewRequest(&corralv1.ImportImageRequest{
		Source: source, Name: name, Insecure: o.Insecure}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return streamResult(stream, func(m *corralv1.ImportImageResponse) (*Imported, bool) {
		switch ev := m.Event.(type) {
		case *corralv1.ImportImageResponse_Progress:
			if o.Progress != nil {
				p := ev.Progress
				o.Progress(ImportProgress{Layer: int(p.Layer), Layers: int(p.Layers), Bytes: p.Bytes, Cached: p.Cached})
			}
		case *corralv1.ImportImageResponse_Result:
			return importedFromProto(ev.Result), true
		}
		return nil, false
	}, "corral client: import "+source)
}

func importedFromProto(r *corralv1.ImportResult) *Imported {
	return &Imported{Composition: compositionFromProto(r.Composition), ImageDigest: r.ImageDigest,
		Layers: layersFromProto(r.Layers), Cached: r.Cached}
}

// RemoveImage removes a built image NAME, or NAME@VERSION (a composition
// and/or a layer). A layer in use fails: IsFailedPrecondition.
func (c *Client) RemoveImage(ctx context.Context, name string) (*Removed, error) {
	resp, err := c.img.RemoveImage(ctx, connect.NewRequest(&corralv1.RemoveImageRequest{Name: name}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return removedFromProto(resp.Msg.Removed), nil
}

// CollectGarbage removes every layer no sandbox, composition or image uses
// (and older versions of a name nothing uses).
func (c *Client) CollectGarbage(ctx context.Context) (*Removed, error) {
	resp, err := c.img.CollectGarbage(ctx, connect.NewRequest(&corralv1.CollectGarbageRequest{}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return removedFromProto(resp.Msg.Removed), nil
}

// Pack turns the sandbox's writes into the layer name (NAME@VERSION) and,
// unless o.NoComposition, the composition name: the sandbox's layers with
// the new one on top, to create sandboxes that start where this one is.
// A running sandbox is paused while it is read.
func (s *Sandbox) Pack(ctx context.Context, name string, o PackOptions) (*Packed, error) {
	resp, err := s.c.img.Pack(ctx, connect.NewRequest(&corralv1.PackRequest{SandboxId: s.id, Name: name,
		Exclude: o.Exclude, NoDefaultExcludes: o.NoDefaultExcludes, NoComposition: o.NoComposition}))
	if err != nil {
		return nil, wrapErr(err)
	}
	out := &Packed{Layer: layerFromProto(resp.Msg.Layer)}
	if resp.Msg.Composition != nil {
		out.Composition = compositionFromProto(resp.Msg.Composition)
	}
	return out, nil
}

func layerFromProto(l *corralv1.Layer) Layer {
	if l == nil {
		return Layer{}
	}
	out := Layer{Ref: l.Ref, Digest: l.Digest, MetaSize: l.MetaSize, BlobDigest: l.BlobDigest, BlobSize: l.BlobSize}
	if z := l.GetLazy(); z != nil {
		out.Lazy = &LazyBlob{BytesFetched: z.BytesFetched, BytesPresent: z.BytesPresent,
			ChunksPresent: int(z.ChunksPresent), ChunksTotal: int(z.ChunksTotal), ChunkSize: z.ChunkSize,
			HitRate: z.HitRate, FailedFetches: z.FailedFetches, CorruptChunks: z.CorruptChunks, Fault: z.Fault}
	}
	return out
}

// PullLayer learns a layer another node published to the shared blob
// store, by its digest: only its metadata is copied; file data is fetched
// when read. name (NAME@VERSION) records it under another name than the
// one it was published under.
func (c *Client) PullLayer(ctx context.Context, digest, name string) (Layer, error) {
	resp, err := c.img.PullLayer(ctx, connect.NewRequest(&corralv1.PullLayerRequest{Digest: digest, Name: name}))
	if err != nil {
		return Layer{}, wrapErr(err)
	}
	return layerFromProto(resp.Msg.Layer), nil
}

func layersFromProto(ls []*corralv1.Layer) []Layer {
	return fromProtos(ls, layerFromProto)
}

func compositionFromProto(c *corralv1.Composition) Composition {
	if c == nil {
		return Composition{}
	}
	return Composition{Ref: c.Ref, Layers: c.Layers, Env: c.Env}
}

func removedFromProto(r *corralv1.Removed) *Removed {
	if r == nil {
		return &Removed{}
	}
	return &Removed{Images: r.Images, Compositions: r.Compositions, Layers: layersFromProto(r.Layers),
		Deleted: r.Deleted, FreedBytes: r.FreedBytes}
}
