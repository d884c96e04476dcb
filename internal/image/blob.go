package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// BlobSource gives the kernel a file to read a split layer's data blob
// from: the mount passes its path as the EROFS extra device
// (device=<path>). The default, LocalBlobs, is the store's own blobs
// directory; a lazy loader returns a file on its FUSE mount that fetches
// chunks from a blob store on first read.
type BlobSource interface {
	// BlobPath returns the path of a readable file holding l's blob
	// (l.BlobDigest, l.BlobSize bytes). It is called before every mount of
	// the layer; the file must stay readable while the layer is mounted.
	BlobPath(ctx context.Context, l Layer) (string, error)
}

// LocalBlobs serves blobs from a directory of complete blob files named
// sha256-<hex>.blob, where the store writes every blob it builds.
type LocalBlobs string

// BlobPath returns the blob's file in the directory, which must exist.
func (d LocalBlobs) BlobPath(ctx context.Context, l Layer) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if !digestRE.MatchString(l.BlobDigest) {
		return "", errdefs.InvalidArgument("layer %s: bad blob digest %q", l.Ref, l.BlobDigest)
	}
	p := filepath.Join(string(d), digestAlgo+"-"+strings.TrimPrefix(l.BlobDigest, digestAlgo+":")+blobExt)
	st, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return "", errdefs.NotFound("layer %s: blob %s missing from %s", l.Ref, l.BlobDigest, string(d))
	}
	if err != nil {
		return "", fmt.Errorf("layer %s: blob: %w", l.Ref, err)
	}
	if st.Size() != l.BlobSize {
		return "", errdefs.FailedPrecondition("layer %s: blob %s is %d bytes, want %d (truncated?)", l.Ref, l.BlobDigest, st.Size(), l.BlobSize)
	}
	return p, nil
}

// Option configures Open.
type Option func(*Store)

// WithBlobSource makes the store mount split layers with blobs from src
// instead of its own blobs directory (which still receives every blob it
// builds).
func WithBlobSource(src BlobSource) Option {
	return func(s *Store) { s.blobSrc = src }
}

// BlobsDir is the directory where the store writes the blobs it builds
// (sha256-<hex>.blob): what a blob store uploads or serves.
func (s *Store) BlobsDir() string { return s.blobs }
