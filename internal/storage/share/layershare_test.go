package share

import (
	"context"
	"crypto/rand"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/blob"
	"github.com/corral-dev/corral/internal/storage/layers"
)

// TestPublishPull: a layer published by one image store (to a shared
// directory store) is pulled into another with only its metadata; the
// pulling store mounts it with the blob its BlobSource names. A tampered
// record or metadata is refused and leaves nothing in the pulling store.
// (The lazy blob server is tested in lazyblob and, wired in, in test/e2e.)
func TestPublishPull(t *testing.T) {
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		t.Skip(err)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	ctx := context.Background()
	shared, err := blob.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	peer, err := blob.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := &Share{cfg: Config{Store: blob.Config{Kind: "dir"}, ChunkSize: blob.DefaultChunkSize},
		store: shared, peer: peer, log: slog.New(slog.DiscardHandler)}

	a, err := layers.Open(ctx, t.TempDir(), layers.WithPublisher(s))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(true)
	src := t.TempDir()
	data := make([]byte, 3<<20)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(src, "big"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(src, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := a.CreateLayer(ctx, "data@1", src)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []blob.Store{shared, peer} {
		if _, err := st.Stat(ctx, l.Digest+blob.LayerSuffix); err != nil {
			t.Fatalf("record not published: %v", err)
		}
	}
	if _, err := peer.Stat(ctx, l.BlobDigest); !errdefs.IsNotFound(err) {
		t.Errorf("the blob was copied into the peer directory: %v", err)
	}

	// B serves the blob from A's blobs directory: a stand-in for the lazy file.
	b, err := layers.Open(ctx, t.TempDir(), layers.WithBlobSource(layers.LocalBlobs(a.BlobsDir())))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(true)

	recPath, _ := shared.Path(l.Digest + blob.LayerSuffix)
	rec, _ := os.ReadFile(recPath)
	metaKey := between(string(rec), `"meta_digest":"`, `"`)
	metaPath, _ := shared.Path(metaKey)
	meta, _ := os.ReadFile(metaPath)
	tamper := func(path string, content []byte) {
		t.Helper()
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bad := append([]byte(nil), meta...)
	bad[len(bad)/2] ^= 1
	tamper(metaPath, bad)
	if _, err := s.Pull(ctx, b, l.Digest, ""); !errdefs.IsInvalidArgument(err) {
		t.Errorf("pull with tampered metadata: %v, want invalid argument", err)
	}
	tamper(metaPath, meta)
	tamper(recPath, []byte(strings.Replace(string(rec), l.Digest, "sha256:"+strings.Repeat("a", 64), 1)))
	if _, err := s.Pull(ctx, b, l.Digest, ""); !errdefs.IsInvalidArgument(err) {
		t.Errorf("pull of a record naming another layer: %v, want invalid argument", err)
	}
	tamper(recPath, rec)
	if ls, _ := b.Layers(ctx); len(ls) != 0 {
		t.Fatalf("refused pulls left layers: %+v", ls)
	}
	if left, _ := filepath.Glob(filepath.Join(b.BlobsDir(), "..", "layers", "*.erofs")); len(left) != 0 {
		t.Fatalf("refused pulls left metadata: %v", left)
	}
	if _, err := s.Pull(ctx, b, "sha256:nope", ""); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "digest") {
		t.Errorf("bad digest: %v", err)
	}

	got, err := s.Pull(ctx, b, l.Digest, "copy@1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Ref != "copy@1" || got.Digest != l.Digest || got.BlobDigest != l.BlobDigest || got.MetaSize != l.MetaSize {
		t.Fatalf("pulled %+v, published %+v", got, l)
	}
	if _, err := os.Stat(filepath.Join(b.BlobsDir(), "sha256-"+strings.TrimPrefix(l.BlobDigest, "sha256:")+".blob")); !os.IsNotExist(err) {
		t.Errorf("pull copied the blob: %v", err)
	}
	// Same name, same layer: fine; same name, other layer: refused.
	if _, err := s.Pull(ctx, b, l.Digest, "copy@1"); err != nil {
		t.Errorf("pull again: %v", err)
	}
	other := t.TempDir()
	if err := os.Chmod(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateLayer(ctx, "other@1", other); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pull(ctx, b, l.Digest, "other@1"); !errdefs.IsAlreadyExists(err) {
		t.Errorf("pull under a taken name: %v, want already exists", err)
	}
	img, err := b.Acquire(ctx, "copy@1", "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release("test")
	read, err := os.ReadFile(filepath.Join(img.Layers[0], "big"))
	if err != nil || string(read) != string(data) {
		t.Fatalf("file through the pulled layer: %d bytes, %v", len(read), err)
	}
}

func between(s, from, to string) string {
	_, rest, _ := strings.Cut(s, from)
	v, _, _ := strings.Cut(rest, to)
	return v
}
