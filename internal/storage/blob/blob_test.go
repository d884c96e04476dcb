package blob_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/seaweed"
	"github.com/corral-dev/corral/internal/storage/blob"
)

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// conformance runs the Store contract against put (where content goes in)
// and get (the store under test, which may read put's content).
func conformance(t *testing.T, put, get blob.Store) {
	ctx := context.Background()
	data := make([]byte, 3<<20+123)
	rand.Read(data)
	key := digestOf(data)

	if err := put.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("put: %v", err)
	}
	if err := put.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("put again: %v", err)
	}
	n, err := get.Stat(ctx, key)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("stat: %d, %v; want %d", n, err, len(data))
	}
	for _, r := range [][2]int64{{0, 1}, {0, int64(len(data))}, {1 << 20, 4096}, {int64(len(data)) - 7, 7}, {5, 0}} {
		rc, err := get.GetRange(ctx, key, r[0], r[1])
		if err != nil {
			t.Fatalf("range %v: %v", r, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, data[r[0]:r[0]+r[1]]) {
			t.Fatalf("range %v: %d bytes, %v; content differs", r, len(got), err)
		}
	}
	if _, err := get.GetRange(ctx, key, int64(len(data))-1, 2); !errdefs.IsInvalidArgument(err) {
		t.Errorf("range past the end: %v, want invalid argument", err)
	}
	missing := digestOf([]byte("missing"))
	if _, err := get.Stat(ctx, missing); !errdefs.IsNotFound(err) {
		t.Errorf("stat missing: %v, want not found", err)
	}
	if _, err := get.GetRange(ctx, missing, 0, 1); !errdefs.IsNotFound(err) {
		t.Errorf("get missing: %v, want not found", err)
	}
	if _, err := get.Stat(ctx, "../etc/passwd"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad key: %v, want invalid argument", err)
	}
	// Content that does not hash to its key is refused and not stored.
	other := digestOf([]byte("other"))
	if err := put.Put(ctx, other, bytes.NewReader(data), int64(len(data))); !errdefs.IsInvalidArgument(err) {
		t.Errorf("put under a wrong digest: %v, want invalid argument", err)
	}
	if _, err := get.Stat(ctx, other); !errdefs.IsNotFound(err) {
		t.Errorf("after a refused put: %v, want not found", err)
	}
	if err := put.Put(ctx, missing, bytes.NewReader([]byte("missin")), 6); !errdefs.IsInvalidArgument(err) {
		t.Errorf("put of a wrong size: %v", err)
	}
}

func TestDir(t *testing.T) {
	d, err := blob.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	conformance(t, d, d)
}

// A node's blobs read by a peer through Handler, with Range requests.
func TestHTTPPeer(t *testing.T) {
	d, err := blob.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(blob.Handler(d, nil))
	defer srv.Close()
	p := blob.NewHTTP(srv.URL, srv.Client())
	conformance(t, d, p)
	data := []byte("x")
	if err := p.Put(context.Background(), digestOf(data), bytes.NewReader(data), 1); !errdefs.IsNotSupported(err) {
		t.Errorf("put to a peer: %v, want not supported", err)
	}
}

// The S3 backend against a real SeaweedFS. weed comes from scripts/deps.sh;
// without it this fails rather than skips, so CI cannot pass untested.
func TestS3SeaweedFS(t *testing.T) {
	dir := t.TempDir()
	srv, err := seaweed.Start(context.Background(), dir, "corral-test")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	s, err := srv.Store("corral-test")
	if err != nil {
		t.Fatal(err)
	}
	conformance(t, s, s)

	// Publish writes the blob and its manifest; FetchManifest reads it back.
	f := filepath.Join(t.TempDir(), "blob")
	data := make([]byte, 5<<20+17)
	rand.Read(data)
	if err := os.WriteFile(f, data, 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := blob.Publish(context.Background(), s, f, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if m.Blob != digestOf(data) || m.NumChunks() != 6 {
		t.Fatalf("manifest %s with %d chunks", m.Blob, m.NumChunks())
	}
	got, err := blob.FetchManifest(context.Background(), s, m.Blob, m.Size)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got.NumChunks() {
		off, n := got.ChunkRange(i)
		if err := got.Verify(i, data[off:off+n]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := blob.FetchManifest(context.Background(), s, m.Blob, m.Size+1); !errdefs.IsInvalidArgument(err) {
		t.Errorf("manifest for a wrong size: %v", err)
	}
}

func TestManifestChunkSizeChecked(t *testing.T) {
	for _, n := range []int64{0, 1000, 3 << 20, 128 << 20} {
		if err := blob.CheckChunkSize(n); !errdefs.IsInvalidArgument(err) {
			t.Errorf("chunk size %d: %v", n, err)
		}
	}
}
