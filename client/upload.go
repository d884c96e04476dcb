package client

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// openLocal returns a tar stream of path: a directory's tree, or a tar
// file as it is.
func openLocal(ctx context.Context, path string) (io.ReadCloser, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return tarOf(ctx, path)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is neither a directory nor a tar file", path)
	}
	return os.Open(path)
}

// CreateLayerFromTar builds the layer name (NAME@VERSION) from a tar
// stream (OCI whiteouts are converted; trusted.* xattrs are dropped).
func (c *Client) CreateLayerFromTar(ctx context.Context, r io.Reader, name string) (Layer, error) {
	resp, err := upload(ctx, func(ctx context.Context) clientStream[corralv1.UploadLayerRequest, corralv1.CreateLayerResponse] {
		return c.img.UploadLayer(ctx)
	}, &corralv1.UploadLayerRequest{Name: name}, r,
		func(m *corralv1.UploadLayerRequest) *[]byte { return &m.Data })
	if err != nil {
		return Layer{}, err
	}
	return layerFromProto(resp.Layer), nil
}

// archiveSource is an oci: or docker-archive: import source on this machine.
type archiveSource struct {
	format corralv1.ArchiveFormat
	path   string
	image  string // ref.name or REPO:TAG; empty: the only one
}

func localArchive(source string) (archiveSource, bool) {
	for prefix, f := range map[string]corralv1.ArchiveFormat{
		"oci:":            corralv1.ArchiveFormat_ARCHIVE_FORMAT_OCI_LAYOUT,
		"docker-archive:": corralv1.ArchiveFormat_ARCHIVE_FORMAT_DOCKER_ARCHIVE,
	} {
		if rest, ok := strings.CutPrefix(source, prefix); ok {
			p, image, _ := strings.Cut(rest, ":")
			return archiveSource{format: f, path: p, image: image}, true
		}
	}
	return archiveSource{}, false
}

// uploadImage streams an OCI layout directory (as a tar) or a docker
// archive file to the server and imports it.
func (c *Client) uploadImage(ctx context.Context, src archiveSource, name string) (*Imported, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var r io.ReadCloser
	var err error
	if src.format == corralv1.ArchiveFormat_ARCHIVE_FORMAT_OCI_LAYOUT {
		r, err = tarOf(ctx, src.path)
	} else {
		r, err = os.Open(src.path)
	}
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", src.path, err)
	}
	defer r.Close()
	res, err := upload(ctx, func(ctx context.Context) clientStream[corralv1.UploadImageRequest, corralv1.ImportResult] {
		return c.img.UploadImage(ctx)
	}, &corralv1.UploadImageRequest{Format: src.format, Image: src.image, Name: name}, r,
		func(m *corralv1.UploadImageRequest) *[]byte { return &m.Data })
	if err != nil {
		return nil, err
	}
	return importedFromProto(res), nil
}
