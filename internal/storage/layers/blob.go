package layers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/blob"
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

// LazySource is a BlobSource that fetches some blobs on first read. The
// store does not read the layers of those into the page cache after
// mounting them (see warmLayer): that would fetch the whole blob.
type LazySource interface {
	BlobSource
	// LazilyRead reports whether BlobPath serves l's blob lazily.
	LazilyRead(ctx context.Context, l Layer) bool
}

// lazilyRead reports whether l's blob is fetched lazily by the store's
// BlobSource.
func (s *Store) lazilyRead(ctx context.Context, l Layer) bool {
	lazy, ok := s.blobSrc.(LazySource)
	return ok && l.Split() && lazy.LazilyRead(ctx, l)
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

// Publisher makes the layers a store creates (built, imported, packed,
// made from a directory) available to other nodes, e.g. by uploading
// their files to a shared blob store.
type Publisher interface {
	// Publish shares l, whose files are at meta and blob. A failure does
	// not concern the layer's creator (the layer is usable on this node):
	// the publisher logs it and retries later.
	Publish(ctx context.Context, l Layer, meta, blob string)
}

// WithPublisher hands every split layer the store creates to p once it is
// stored.
func WithPublisher(p Publisher) Option {
	return func(s *Store) { s.publish = p }
}

// LayerFiles returns the paths of l's metadata file and of its blob in
// the store's blobs directory (where only blobs made on this node are).
func (s *Store) LayerFiles(l Layer) (meta, blob string) {
	return s.metaFile(l.Digest), s.blobFile(l.BlobDigest)
}

// AddLayer records l, a split layer made on another node, from its
// metadata (l.MetaSize bytes read from meta, whose content the caller has
// checked): only the metadata becomes local; the BlobSource must provide
// the blob when the layer is mounted. l.Ref names it here; an existing
// ref with another digest fails (errdefs.AlreadyExists), with the same
// digest it returns the existing layer.
func (s *Store) AddLayer(ctx context.Context, l Layer, meta io.Reader) (Layer, error) {
	if err := checkRef(l.Ref); err != nil {
		return Layer{}, err
	}
	if !digestRE.MatchString(l.Digest) || !digestRE.MatchString(l.BlobDigest) {
		return Layer{}, errdefs.InvalidArgument("layer %s: digest %q and blob digest %q must be sha256:<64 hex>", l.Ref, l.Digest, l.BlobDigest)
	}
	if l.MetaSize <= 0 || l.BlobSize < 0 {
		return Layer{}, errdefs.InvalidArgument("layer %s: meta size %d / blob size %d out of range", l.Ref, l.MetaSize, l.BlobSize)
	}
	tmp, err := os.CreateTemp(s.layers, tmpPrefix+"layer-")
	if err != nil {
		return Layer{}, fmt.Errorf("layer %s: %w", l.Ref, err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	n, err := io.Copy(tmp, io.LimitReader(blob.ContextReader(ctx, meta), l.MetaSize+1))
	if err == nil && n != l.MetaSize {
		err = errdefs.InvalidArgument("layer %s: metadata is %d bytes, want %d", l.Ref, n, l.MetaSize)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Layer{}, fmt.Errorf("layer %s: metadata: %w", l.Ref, err)
	}
	idx, unlock, err := s.lockedIndex()
	if err != nil {
		return Layer{}, err
	}
	defer unlock()
	if old, ok := idx.Layers[l.Ref]; ok {
		if old != l.Digest {
			return Layer{}, errdefs.AlreadyExists("name: layer %s exists with digest %s (pick another name)", l.Ref, old)
		}
		return idx.describe(l.Ref, old), nil
	}
	if err := os.Rename(tmp.Name(), s.metaFile(l.Digest)); err != nil {
		return Layer{}, fmt.Errorf("layer %s: store metadata: %w", l.Ref, err)
	}
	if err := syncfs(s.layers); err != nil {
		return Layer{}, err
	}
	idx.Layers[l.Ref] = l.Digest
	idx.Digests[l.Digest] = layerFiles{MetaSize: l.MetaSize, BlobDigest: l.BlobDigest, BlobSize: l.BlobSize}
	idx.Latest[l.Name()] = l.Version()
	if err := s.writeIndex(idx); err != nil {
		return Layer{}, fmt.Errorf("layer %s: %w", l.Ref, err)
	}
	return idx.describe(l.Ref, l.Digest), nil
}
