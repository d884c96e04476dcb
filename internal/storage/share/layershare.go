// Package share shares a node's layers through a blob store shared
// by many nodes: it publishes the layers this node makes (blob, chunk
// manifest, metadata and a layer record), lets a node learn a layer it
// does not have from its record and metadata alone, and serves the blobs
// of such layers as lazily fetched files (storage/lazy), watching for
// fetch faults. It is the glue between storage/layers, storage/blob and
// storage/lazy, and imports those and errdefs only; never a backend, the
// node or the API.
package share

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/blob"
	image "github.com/corral-dev/corral/internal/storage/layers"
	lazyblob "github.com/corral-dev/corral/internal/storage/lazy"
)

// Config configures the share of one node.
type Config struct {
	// Store is the shared blob store.
	Store blob.Config
	// ChunkSize is the fetch chunk size of published blobs (default
	// blob.DefaultChunkSize).
	ChunkSize int64
	// Dir holds the lazy blob server's mount point, cache, socket and log.
	Dir string
	// CacheLimit bounds the chunk cache in bytes (0: lazyblob's default).
	CacheLimit int64
	// FetchTimeout bounds one chunk fetch: a reader gets EIO after it
	// (0: lazyblob's default).
	FetchTimeout time.Duration
	// LocalBlobs is the image store's blobs directory: a blob there is
	// mounted directly (it is complete), only others lazily.
	LocalBlobs string
	// ServerArgv runs the lazy blob server (corral's hidden lazyblob-serve).
	ServerArgv []string
	Logger     *slog.Logger
}

// Share is a node's connection to the shared store.
type Share struct {
	cfg   Config
	store blob.Store
	peer  *blob.Dir // manifests, metadata and records this node published
	lazy  *lazyblob.Client
	log   *slog.Logger
}

// Open opens the store (creating an S3 bucket if needed) and starts the
// lazy blob server, or reattaches to the one an earlier run left.
func Open(ctx context.Context, cfg Config) (*Share, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = blob.DefaultChunkSize
	}
	if err := blob.CheckChunkSize(cfg.ChunkSize); err != nil {
		return nil, err
	}
	store, err := blob.Open(cfg.Store)
	if err != nil {
		return nil, fmt.Errorf("blob store: %w", err)
	}
	if s3, ok := store.(*blob.S3); ok {
		// A node whose store is down still starts: it serves what it has
		// whole or cached, and reads of the rest fail until the store is back.
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s3.EnsureBucket(bctx)
		cancel()
		if err != nil {
			cfg.Logger.Warn("blob store unreachable: layer data not on this node cannot be read until it is back", "err", err)
		}
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("lazy blobs: %w", err)
	}
	peer, err := blob.OpenDir(filepath.Join(cfg.Dir, "published"))
	if err != nil {
		return nil, fmt.Errorf("lazy blobs: %w", err)
	}
	lazy, err := lazyblob.Start(ctx, lazyblob.ServerConfig{
		Config: lazyblob.Config{
			Mountpoint:   filepath.Join(cfg.Dir, "mnt"),
			CacheDir:     filepath.Join(cfg.Dir, "cache"),
			CacheLimit:   cfg.CacheLimit,
			FetchTimeout: cfg.FetchTimeout,
		},
		Store:            cfg.Store,
		Socket:           filepath.Join(cfg.Dir, "lazyblob.sock"),
		AttributeCgroups: true,
	}, cfg.ServerArgv, os.Environ(), filepath.Join(cfg.Dir, "lazyblob.log"))
	if err != nil {
		return nil, err
	}
	return &Share{cfg: cfg, store: store, peer: peer, lazy: lazy, log: cfg.Logger}, nil
}

// Store is the shared blob store.
func (s *Share) Store() blob.Store { return s.store }

// Lazy is the client of the lazy blob server.
func (s *Share) Lazy() *lazyblob.Client { return s.lazy }

// BlobPath implements image.BlobSource: the local blob when this node has
// it whole, else a lazily fetched file on the lazy blob server's mount.
func (s *Share) BlobPath(ctx context.Context, l image.Layer) (string, error) {
	p, err := image.LocalBlobs(s.cfg.LocalBlobs).BlobPath(ctx, l)
	if !errdefs.IsNotFound(err) {
		return p, err
	}
	p, err = s.lazy.Register(ctx, l.BlobDigest, l.BlobSize)
	if err != nil {
		return "", fmt.Errorf("layer %s: lazy blob %s: %w", l.Ref, l.BlobDigest, err)
	}
	return p, nil
}

// LazilyRead implements image.LazySource: whether BlobPath serves l's
// blob lazily.
func (s *Share) LazilyRead(ctx context.Context, l image.Layer) bool {
	if !l.Split() {
		return false
	}
	_, err := image.LocalBlobs(s.cfg.LocalBlobs).BlobPath(ctx, l)
	return errdefs.IsNotFound(err)
}

// Record is what a node needs to learn a layer: stored in the blob store
// under the layer digest + blob.LayerSuffix, beside the metadata (under
// its own digest), the blob and its chunk manifest.
type Record struct {
	Ref        string `json:"ref"` // the name it was made under, a default
	Digest     string `json:"digest"`
	MetaDigest string `json:"meta_digest"`
	MetaSize   int64  `json:"meta_size"`
	BlobDigest string `json:"blob_digest"`
	BlobSize   int64  `json:"blob_size"`
}

// Publish implements image.Publisher; a failure is logged, and retried by
// PublishMissing at the next start.
func (s *Share) Publish(ctx context.Context, l image.Layer, metaPath, blobPath string) {
	if err := s.publish(ctx, l, metaPath, blobPath); err != nil {
		s.log.Warn("layer stored on this node but not published (retried at the next start)", "ref", l.Ref, "err", err)
	}
}

// publish shares l: blob, manifest, metadata, then the
// record, so a record never names something the store lacks. The small
// objects (manifest, metadata, record) also go to the node's own peer
// directory, which PeerStore serves with the local blobs. A read-only
// shared store (kind http: another node) gets nothing. Layers of an
// earlier store version (no blob) are not shared.
func (s *Share) publish(ctx context.Context, l image.Layer, metaPath, blobPath string) error {
	m, err := blob.BuildManifest(ctx, blobPath, s.cfg.ChunkSize)
	if err != nil {
		return fmt.Errorf("publish layer %s: %w", l.Ref, err)
	}
	manifest, err := json.Marshal(m)
	if err != nil {
		return err
	}
	metaDigest, err := fileDigest(metaPath)
	if err != nil {
		return fmt.Errorf("publish layer %s: %w", l.Ref, err)
	}
	rec, err := json.Marshal(Record{Ref: l.Ref, Digest: l.Digest, MetaDigest: metaDigest, MetaSize: l.MetaSize,
		BlobDigest: l.BlobDigest, BlobSize: l.BlobSize})
	if err != nil {
		return err
	}
	stores := []blob.Store{s.peer}
	if s.cfg.Store.Kind != "http" {
		stores = append([]blob.Store{s.store}, stores...)
	}
	for _, st := range stores {
		if st == s.store {
			if err := putFile(ctx, st, m.Blob, blobPath, m.Size); err != nil {
				return fmt.Errorf("publish layer %s blob: %w", l.Ref, err)
			}
		}
		if err := st.Put(ctx, m.Blob+blob.ManifestSuffix, bytes.NewReader(manifest), int64(len(manifest))); err != nil {
			return fmt.Errorf("publish layer %s manifest: %w", l.Ref, err)
		}
		if err := putFile(ctx, st, metaDigest, metaPath, l.MetaSize); err != nil {
			return fmt.Errorf("publish layer %s metadata: %w", l.Ref, err)
		}
		if err := st.Put(ctx, l.Digest+blob.LayerSuffix, bytes.NewReader(rec), int64(len(rec))); err != nil {
			return fmt.Errorf("publish layer %s record: %w", l.Ref, err)
		}
	}
	s.log.Info("layer published", "ref", l.Ref, "digest", l.Digest, "blob_bytes", l.BlobSize)
	return nil
}

// PublishMissing publishes every layer this node has whole whose record
// the store lacks (a publish that failed, or layers made before the node
// had a store). paths gives a layer's metadata and blob files.
func (s *Share) PublishMissing(ctx context.Context, layers []image.Layer, paths func(image.Layer) (meta, blob string)) error {
	var errs []error
	for _, l := range layers {
		if !l.Split() {
			continue
		}
		meta, blobPath := paths(l)
		if _, err := os.Stat(blobPath); err != nil {
			continue // a layer learnt from the store
		}
		if s.published(ctx, l) {
			continue
		}
		if err := s.publish(ctx, l, meta, blobPath); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// published reports whether l's record is in the peer directory and in
// the shared store (unless that is read-only).
func (s *Share) published(ctx context.Context, l image.Layer) bool {
	key := l.Digest + blob.LayerSuffix
	if _, err := s.peer.Stat(ctx, key); err != nil {
		return false
	}
	if s.cfg.Store.Kind == "http" {
		return true
	}
	_, err := s.store.Stat(ctx, key)
	return err == nil
}

func putFile(ctx context.Context, st blob.Store, key, path string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return st.Put(ctx, key, f, size)
}

// PeerStore is what this node serves to peers (blob.Handler on
// --blob-listen): the blobs it has whole, and the manifests, metadata and
// records of the layers it published.
func (s *Share) PeerStore() (blob.Store, error) {
	blobs, err := blob.OpenDir(s.cfg.LocalBlobs)
	if err != nil {
		return nil, err
	}
	return union{s.peer, blobs}, nil
}

// union reads from the first store that has the key.
type union []blob.Store

func (u union) Stat(ctx context.Context, key string) (int64, error) {
	for _, s := range u[:len(u)-1] {
		if n, err := s.Stat(ctx, key); !errdefs.IsNotFound(err) {
			return n, err
		}
	}
	return u[len(u)-1].Stat(ctx, key)
}

func (u union) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	for _, s := range u[:len(u)-1] {
		if _, err := s.Stat(ctx, key); err == nil {
			return s.GetRange(ctx, key, off, n)
		}
	}
	return u[len(u)-1].GetRange(ctx, key, off, n)
}

func (u union) Put(context.Context, string, io.Reader, int64) error {
	return errdefs.NotSupported("put: the peer store is read-only")
}

// maxRecord bounds a layer record read from the store.
const maxRecord = 64 << 10

// Pull learns layer digest from the store: its record and metadata only
// (the blob is fetched lazily when the layer is read). ref names it here
// ("" = the name it was published under).
func (s *Share) Pull(ctx context.Context, images *image.Store, digest, ref string) (image.Layer, error) {
	key := digest + blob.LayerSuffix
	if err := blob.CheckKey(key); err != nil {
		return image.Layer{}, errdefs.InvalidArgument("digest: %q must be sha256:<64 hex> (a layer digest, as image ls shows it)", digest)
	}
	b, err := readAll(ctx, s.store, key, maxRecord)
	if err != nil {
		return image.Layer{}, fmt.Errorf("pull layer %s: %w", digest, err)
	}
	var rec Record
	if err := json.Unmarshal(b, &rec); err != nil {
		return image.Layer{}, errdefs.InvalidArgument("pull layer %s: record: %v", digest, err)
	}
	if rec.Digest != digest {
		return image.Layer{}, errdefs.InvalidArgument("pull layer %s: record names layer %s", digest, rec.Digest)
	}
	if ref == "" {
		ref = rec.Ref
	}
	if err := blob.CheckKey(rec.MetaDigest); err != nil || rec.MetaSize <= 0 || rec.MetaSize > maxMeta {
		return image.Layer{}, errdefs.InvalidArgument("pull layer %s: metadata %q of %d bytes (limit %d)", digest, rec.MetaDigest, rec.MetaSize, int64(maxMeta))
	}
	// The blob's manifest must be there too, or no read could succeed.
	if _, err := blob.FetchManifest(ctx, s.store, rec.BlobDigest, rec.BlobSize); err != nil {
		return image.Layer{}, fmt.Errorf("pull layer %s: %w", digest, err)
	}
	meta, err := readAll(ctx, s.store, rec.MetaDigest, rec.MetaSize)
	if err != nil {
		return image.Layer{}, fmt.Errorf("pull layer %s: metadata: %w", digest, err)
	}
	if got := sha256.Sum256(meta); "sha256:"+hex.EncodeToString(got[:]) != rec.MetaDigest || int64(len(meta)) != rec.MetaSize {
		return image.Layer{}, errdefs.InvalidArgument("pull layer %s: metadata does not match %s", digest, rec.MetaDigest)
	}
	return images.AddLayer(ctx, image.Layer{Ref: ref, Digest: rec.Digest, MetaSize: rec.MetaSize,
		BlobDigest: rec.BlobDigest, BlobSize: rec.BlobSize}, bytes.NewReader(meta))
}

// maxMeta bounds a layer's metadata read into memory on a pull.
const maxMeta = 256 << 20

func readAll(ctx context.Context, s blob.Store, key string, limit int64) ([]byte, error) {
	n, err := s.Stat(ctx, key)
	if err != nil {
		return nil, err
	}
	if n > limit {
		return nil, errdefs.InvalidArgument("%s is %d bytes (limit %d)", key, n, limit)
	}
	rc, err := s.GetRange(ctx, key, 0, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return blob.Digest(h), nil
}

// Stats returns the lazy figures of blob digest; ok is false when this
// node has the blob whole (it is not served lazily).
func (s *Share) Stats(ctx context.Context, blobDigest string) (st lazyblob.Stats, ok bool, err error) {
	st, err = s.lazy.Stats(ctx, blobDigest)
	if errdefs.IsNotFound(err) {
		return st, false, nil
	}
	return st, err == nil, err
}

// Close ends the lazy blob server when shutdown is set (the daemon
// cleans up on exit and every layer on it is unmounted by now); else it
// keeps serving the layers of sandboxes that outlive the daemon.
func (s *Share) Close(ctx context.Context, shutdown bool) error {
	if !shutdown {
		return nil
	}
	err := s.lazy.Shutdown(ctx)
	if errdefs.IsUnavailable(err) {
		// The server is gone (crashed): detach the mount it left, as a new
		// server would.
		mnt := filepath.Join(s.cfg.Dir, "mnt")
		if uerr := unix.Unmount(mnt, unix.MNT_DETACH); uerr != nil && uerr != unix.EINVAL && uerr != unix.ENOENT {
			return fmt.Errorf("lazy blob server is gone (%v); detach its mount %s: %w", err, mnt, uerr)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("lazy blob server: %w", err)
	}
	return nil
}
