package layers

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/corral-dev/corral/internal/errdefs"
)

// tarLayer makes an image layer of files (path -> content; "" with a
// trailing / is a directory).
func tarLayer(t *testing.T, files map[string]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for p, content := range files {
		h := &tar.Header{Name: p, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}
		if strings.HasSuffix(p, "/") {
			h = &tar.Header{Name: p, Mode: 0o755, Typeflag: tar.TypeDir}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return rawLayer(t, buf.Bytes())
}

func rawLayer(t *testing.T, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage is a two-layer image: the second deletes, replaces and adds.
func testImage(t *testing.T) v1.Image {
	t.Helper()
	big := make([]byte, 2<<20)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image,
		tarLayer(t, map[string]string{"etc/": "", "etc/os": "base\n", "gone": "g", "dir/": "", "dir/old": "o", "big": string(big)}),
		tarLayer(t, map[string]string{".wh.gone": "", "dir/": "", "dir/.wh..wh..opq": "", "dir/new": "n", "etc/os": "top\n"}))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Config.Env = []string{"PATH=/bin", "IMPORTED=1"}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// storeFiles counts the layer metadata and blob files of the store.
func storeFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	for _, pat := range []string{"layers/*.erofs", "blobs/*.blob"} {
		m, _ := filepath.Glob(filepath.Join(dir, pat))
		n += len(m)
	}
	return n
}

func checkImported(t *testing.T, s *Store, ref string) {
	t.Helper()
	img, err := s.Get(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Stack) != 2 || !strings.Contains(strings.Join(img.Env, " "), "IMPORTED=1") {
		t.Fatalf("image %+v", img)
	}
	root := overlayOf(t, img)
	for p, want := range map[string]string{"etc/os": "top\n", "dir/new": "n"} {
		if got := readIn(t, root, p); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	for _, p := range []string{"gone", "dir/old", ".wh.gone", "dir/.wh..wh..opq"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			t.Errorf("%s exists", p)
		}
	}
}

// TestImportRegistry pulls from an in-process registry; a second import
// of the same image converts nothing and stores nothing.
func TestImportRegistry(t *testing.T) {
	needMkfs(t)
	s, dir := openStore(t)
	ctx := context.Background()
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	src := strings.TrimPrefix(srv.URL, "http://") + "/corral/test:v1"
	ref, err := name.ParseReference(src, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, testImage(t)); err != nil {
		t.Fatal(err)
	}
	var progress []ImportProgress
	got, err := s.Import(ctx, ImportOptions{Source: src, Ref: "test@1", Insecure: true,
		Progress: func(p ImportProgress) { progress = append(progress, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if got.Cached || len(got.Layers) != 2 || got.Composition.Ref != "test@1" || !digestRE.MatchString(got.ImageDigest) {
		t.Fatalf("import %+v", got)
	}
	if last := progress[len(progress)-1]; last.Layer != 2 || last.Layers != 2 || last.Bytes < 2<<20 {
		t.Fatalf("progress %+v", progress)
	}
	checkImported(t, s, "test@1")
	files := storeFiles(t, dir)

	for _, r := range []string{"test@1", "again@1"} {
		again, err := s.Import(ctx, ImportOptions{Source: src, Ref: r, Insecure: true})
		if err != nil {
			t.Fatal(err)
		}
		if !again.Cached || again.ImageDigest != got.ImageDigest || again.Layers[1] != got.Layers[1] {
			t.Fatalf("second import %+v", again)
		}
	}
	if n := storeFiles(t, dir); n != files {
		t.Fatalf("second import stored files: %d, was %d", n, files)
	}
	// Imported layers are kept by their compositions only.
	for _, r := range []string{"test@1", "again@1"} {
		if _, err := s.Remove(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	rm, err := s.GC(ctx)
	if err != nil || len(rm.Deleted) != 2 || storeFiles(t, dir) != 0 {
		t.Fatalf("gc after removing the imports: %+v %v, %d files left", rm, err, storeFiles(t, dir))
	}
}

// TestImportLayoutAndArchive imports one image from an OCI layout and
// from a docker save tarball: its layers are stored once.
func TestImportLayoutAndArchive(t *testing.T) {
	needMkfs(t)
	s, dir := openStore(t)
	ctx := context.Background()
	img := testImage(t)
	lp, err := layout.Write(filepath.Join(t.TempDir(), "oci"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "saved.tar")
	tag, _ := name.NewTag("corral/test:v1")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	a, err := s.Import(ctx, ImportOptions{Source: "oci:" + string(lp) + ":v1", Ref: "layout@1"})
	if err != nil {
		t.Fatal(err)
	}
	checkImported(t, s, "layout@1")
	files := storeFiles(t, dir)
	b, err := s.Import(ctx, ImportOptions{Source: "docker-archive:" + archive + ":corral/test:v1", Ref: "archive@1"})
	if err != nil {
		t.Fatal(err)
	}
	checkImported(t, s, "archive@1")
	if a.Layers[0] != b.Layers[0] || a.Layers[1] != b.Layers[1] || storeFiles(t, dir) != files {
		t.Fatalf("layers not shared: %+v vs %+v; files %d then %d", a.Layers, b.Layers, files, storeFiles(t, dir))
	}
	// A taken name fails before anything is converted.
	if _, err := s.CreateComposition(ctx, Composition{Ref: "taken@1", Layers: []string{a.Layers[0].Ref}}); err != nil {
		t.Fatal(err)
	}
	other, err := mutate.AppendLayers(empty.Image, tarLayer(t, map[string]string{"new": "n"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(other, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v2"})); err != nil {
		t.Fatal(err)
	}
	_, err = s.Import(ctx, ImportOptions{Source: "oci:" + string(lp) + ":v2", Ref: "taken@1"})
	wantErr(t, err, errdefs.ErrAlreadyExists, "composition taken@1 exists")
	if n := storeFiles(t, dir); n != files {
		t.Fatalf("a refused import stored files: %d, was %d", n, files)
	}
	_, err = s.Import(ctx, ImportOptions{Source: "oci:" + string(lp) + ":nope", Ref: "x@1"})
	wantErr(t, err, errdefs.ErrInvalidArgument, `0 images named "nope"`)
}

// TestImportCorrupt: a bad tar, a blob that does not match its digest, a
// truncated blob and a missing one fail with a clear error and leave no
// layer, composition or file behind.
func TestImportCorrupt(t *testing.T) {
	needMkfs(t)
	good := tarLayer(t, map[string]string{"ok": "fine\n"})
	garbage := make([]byte, 10000)
	if _, err := rand.Read(garbage); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		// mangle gets the layout and the second layer's blob file.
		mangle func(t *testing.T, blob string)
		layer  v1.Layer
		want   string
	}{
		{name: "bad tar", layer: rawLayer(t, garbage), want: "extract tar"},
		{name: "wrong digest", layer: tarLayer(t, map[string]string{"x": "1"}), want: "the config's diff_id is", mangle: func(t *testing.T, blob string) {
			var buf bytes.Buffer
			zw := gzip.NewWriter(&buf)
			zw.Write(make([]byte, 2048)) // a valid, empty tar of other content
			zw.Close()
			replaceFile(t, blob, buf.Bytes())
		}},
		{name: "truncated", layer: tarLayer(t, map[string]string{"x": strings.Repeat("y", 100000)}), want: "layer 2 of 2", mangle: func(t *testing.T, blob string) {
			b, _ := os.ReadFile(blob)
			replaceFile(t, blob, b[:len(b)/2])
		}},
		{name: "missing blob", layer: tarLayer(t, map[string]string{"x": "1"}), want: "layer 2 of 2", mangle: func(t *testing.T, blob string) {
			if err := os.Remove(blob); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, dir := openStore(t)
			img, err := mutate.AppendLayers(empty.Image, good, tc.layer)
			if err != nil {
				t.Fatal(err)
			}
			lp, err := layout.Write(filepath.Join(t.TempDir(), "oci"), empty.Index)
			if err != nil {
				t.Fatal(err)
			}
			if err := lp.AppendImage(img); err != nil {
				t.Fatal(err)
			}
			if tc.mangle != nil {
				d, err := tc.layer.Digest()
				if err != nil {
					t.Fatal(err)
				}
				tc.mangle(t, filepath.Join(string(lp), "blobs", d.Algorithm, d.Hex))
			}
			_, err = s.Import(context.Background(), ImportOptions{Source: "oci:" + string(lp), Ref: "bad@1"})
			t.Log(err)
			wantErr(t, err, errdefs.ErrInvalidArgument, tc.want)
			ctx := context.Background()
			if layers, _ := s.Layers(ctx); len(layers) != 0 {
				t.Errorf("layers left: %+v", layers)
			}
			if comps, _ := s.Compositions(ctx); len(comps) != 0 {
				t.Errorf("compositions left: %+v", comps)
			}
			if n := storeFiles(t, dir); n != 0 {
				t.Errorf("%d layer files left", n)
			}
			assertNoLeftovers(t, filepath.Join(dir, "layers"))
			assertNoLeftovers(t, filepath.Join(dir, "blobs"))
		})
	}
}

func replaceFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
