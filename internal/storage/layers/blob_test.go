package layers

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

// copiedBlobs serves blobs from copies in its own directory, as a lazy
// loader serves them from a FUSE mount, and counts the calls.
type copiedBlobs struct {
	dir, from string
	calls     int
}

func (c *copiedBlobs) BlobPath(ctx context.Context, l Layer) (string, error) {
	c.calls++
	src, err := LocalBlobs(c.from).BlobPath(ctx, l)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(c.dir, "served-"+strings.TrimPrefix(l.BlobDigest, "sha256:"))
	b, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	return dst, os.WriteFile(dst, b, 0o444)
}

// TestSplitLayer: a layer is small metadata plus a chunked blob holding
// the file contents; the mount reads contents from the blob the
// BlobSource names, and the digests describe both files.
func TestSplitLayer(t *testing.T) {
	needMkfs(t)
	dir := t.TempDir()
	ctx := context.Background()
	src := &copiedBlobs{dir: t.TempDir(), from: filepath.Join(dir, "blobs")}
	s, err := Open(ctx, dir, WithBlobSource(src))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(true)
	big := make([]byte, 3*ChunkSize+12345)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	root := tree(t, map[string]string{"small": "tiny\n"})
	if err := os.WriteFile(filepath.Join(root, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := s.CreateLayer(ctx, "data@1", root)
	if err != nil {
		t.Fatal(err)
	}
	if !l.Split() || l.BlobSize < int64(len(big)) || l.MetaSize <= 0 || l.MetaSize > 64<<10 {
		t.Fatalf("layer %+v: want a blob of at least %d bytes and small metadata", l, len(big))
	}
	blob, err := os.ReadFile(s.blobFile(l.BlobDigest))
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(blob); "sha256:"+hex.EncodeToString(sum[:]) != l.BlobDigest || int64(len(blob)) != l.BlobSize {
		t.Fatalf("blob file does not match its digest or size")
	}
	if !bytes.Contains(blob, big[:4096]) {
		t.Fatal("the blob does not hold the file contents")
	}
	if st, _ := os.Stat(s.metaFile(l.Digest)); st == nil || st.Size() != l.MetaSize {
		t.Fatalf("metadata file: %v", st)
	}
	img, err := s.Get(ctx, "data@1")
	if err != nil {
		t.Fatal(err)
	}
	if src.calls != 1 {
		t.Fatalf("BlobSource called %d times, want 1", src.calls)
	}
	assertMounted(t, img.Layers[0], true)
	got, err := os.ReadFile(filepath.Join(img.Layers[0], "big"))
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("big: %d bytes, %v", len(got), err)
	}
	if got, _ := os.ReadFile(filepath.Join(img.Layers[0], "small")); string(got) != "tiny\n" {
		t.Fatalf("small: %q", got)
	}

	// A missing blob fails the mount with the blob named.
	if err := s.Close(true); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(s.blobFile(l.BlobDigest)); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(true)
	_, err = s2.Get(ctx, "data@1")
	wantErr(t, err, errdefs.ErrNotFound, "blob "+l.BlobDigest+" missing")
}

// TestLegacyLayer: a single-file layer of an earlier store version (no
// blob in the index) still mounts.
func TestLegacyLayer(t *testing.T) {
	needMkfs(t)
	s, dir := openStore(t)
	ctx := context.Background()
	root := tree(t, map[string]string{"f": "old format\n"})
	meta := filepath.Join(t.TempDir(), "one.erofs")
	if out, err := execOut("mkfs.erofs", "--quiet", "-T0", "-U"+erofsUUID, meta, root); err != nil {
		t.Fatalf("mkfs: %v %s", err, out)
	}
	b, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if err := os.WriteFile(s.metaFile(digest), b, 0o444); err != nil {
		t.Fatal(err)
	}
	idx := `{"layers": {"old@1": "` + digest + `"}}`
	if err := os.WriteFile(filepath.Join(dir, "layers", indexFile), []byte(idx), 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := s.Get(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	if img.Stack[0].Split() {
		t.Fatalf("legacy layer reported split: %+v", img.Stack[0])
	}
	if got, err := os.ReadFile(filepath.Join(img.Layers[0], "f")); err != nil || string(got) != "old format\n" {
		t.Fatalf("f: %q %v", got, err)
	}
}

func execOut(name string, args ...string) ([]byte, error) {
	return exec.Command(name, args...).CombinedOutput()
}
