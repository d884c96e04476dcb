package control

import (
	"context"
	"io"
	"strings"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/importroot"
	"github.com/corral-dev/corral/internal/storage/layers"
)

// SetImportRoot lets the node administrator name node paths under root
// (nil, the default: no node path at all).
func (s *ImageService) SetImportRoot(root *importroot.Root) { s.importRoot = root }

// openNodePath opens a node path a request names: only for the node
// administrator, only under the import root. Anyone else is told to send
// the content instead; a request without a principal is not the admin.
func (s *ImageService) openNodePath(ctx context.Context, field, p string) (io.ReadCloser, error) {
	if pr, ok := iam.FromContext(ctx); !ok || !pr.NodeAdmin {
		return nil, errdefs.PermissionDenied("%s: %q is a path on the node, which only the node administrator (root on the unix socket) may name; send the content from the client instead (the CLI and SDKs stream it)", field, p)
	}
	f, err := s.importRoot.Open(field, p)
	if err != nil {
		return nil, err
	}
	if importroot.IsDir(f) {
		return importroot.Tar(ctx, f), nil
	}
	return f, nil
}

// createLayerFromNode builds a layer from a node directory or tar file.
func (s *ImageService) createLayerFromNode(ctx context.Context, name, p string) (layers.Layer, error) {
	rc, err := s.openNodePath(ctx, "path", p)
	if err != nil {
		return layers.Layer{}, err
	}
	defer rc.Close()
	return s.images.CreateLayerFromTar(ctx, name, rc, false)
}

// importFromNode imports oci:DIR[:REF] or docker-archive:FILE[:REPO:TAG]
// from the node; ok is false for any other source (a registry).
func (s *ImageService) importFromNode(ctx context.Context, opts layers.ImportOptions) (res layers.Imported, ok bool, err error) {
	var format layers.ArchiveFormat
	var rest string
	switch {
	case strings.HasPrefix(opts.Source, layers.SourceOCILayout):
		format, rest = layers.ArchiveOCILayout, strings.TrimPrefix(opts.Source, layers.SourceOCILayout)
	case strings.HasPrefix(opts.Source, layers.SourceDockerArchive):
		format, rest = layers.ArchiveDocker, strings.TrimPrefix(opts.Source, layers.SourceDockerArchive)
	default:
		return layers.Imported{}, false, nil
	}
	p, which, _ := strings.Cut(rest, ":")
	rc, err := s.openNodePath(ctx, "source", p)
	if err != nil {
		return layers.Imported{}, true, err
	}
	defer rc.Close()
	res, err = s.images.ImportArchive(ctx, opts, format, which, rc)
	return res, true, err
}

// uploadReader reads the data of a client stream's messages after the
// first (already received) one.
type uploadReader struct {
	next func() ([]byte, bool)
	err  func() error
	buf  []byte
	done bool
}

func (r *uploadReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.done {
			return 0, io.EOF
		}
		b, ok := r.next()
		if !ok {
			r.done = true
			if err := r.err(); err != nil {
				return 0, err
			}
			return 0, io.EOF
		}
		r.buf = b
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// streamData returns the first message of a client stream and a reader of
// the data of it and every later one.
func streamData[T any](stream *connect.ClientStream[T], data func(*T) []byte) (*T, io.Reader, error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, nil, err
		}
		return nil, nil, errdefs.InvalidArgument("stream: no message")
	}
	first := stream.Msg()
	r := &uploadReader{buf: data(first), err: stream.Err, next: func() ([]byte, bool) {
		if !stream.Receive() {
			return nil, false
		}
		return data(stream.Msg()), true
	}}
	return first, r, nil
}

func (s *ImageService) UploadLayer(ctx context.Context, stream *connect.ClientStream[corralv1.UploadLayerRequest]) (*connect.Response[corralv1.CreateLayerResponse], error) {
	first, r, err := streamData(stream, func(m *corralv1.UploadLayerRequest) []byte { return m.Data })
	if err != nil {
		return nil, err
	}
	l, err := s.images.CreateLayerFromTar(ctx, first.Name, r, true)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.CreateLayerResponse{Layer: layerToProto(l)}), nil
}

func (s *ImageService) UploadImage(ctx context.Context, stream *connect.ClientStream[corralv1.UploadImageRequest]) (*connect.Response[corralv1.ImportResult], error) {
	first, r, err := streamData(stream, func(m *corralv1.UploadImageRequest) []byte { return m.Data })
	if err != nil {
		return nil, err
	}
	var format layers.ArchiveFormat
	switch first.Format {
	case corralv1.ArchiveFormat_ARCHIVE_FORMAT_OCI_LAYOUT:
		format = layers.ArchiveOCILayout
	case corralv1.ArchiveFormat_ARCHIVE_FORMAT_DOCKER_ARCHIVE:
		format = layers.ArchiveDocker
	default:
		return nil, errdefs.InvalidArgument("format: %v is not OCI_LAYOUT or DOCKER_ARCHIVE", first.Format)
	}
	res, err := s.images.ImportArchive(ctx, layers.ImportOptions{Source: "uploaded " + first.Format.String(), Ref: first.Name},
		format, first.Image, r)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(importResultToProto(res)), nil
}

func importResultToProto(res layers.Imported) *corralv1.ImportResult {
	return &corralv1.ImportResult{Composition: compositionToProto(res.Composition), ImageDigest: res.ImageDigest,
		Layers: layersToProto(res.Layers), Cached: res.Cached}
}
