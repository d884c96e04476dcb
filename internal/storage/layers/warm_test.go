package layers

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
)

// lazyBlobs serves the store's own blobs but says they are read lazily,
// as the lazy blob server's share does for blobs the node lacks.
type lazyBlobs struct{ LocalBlobs }

func (lazyBlobs) LazilyRead(context.Context, Layer) bool { return true }

// TestWarmAfterMount: a new layer mount's files are in its page cache
// before Get returns, executables and shared libraries first when the
// budget runs out; a lazily read layer is left alone.
func TestWarmAfterMount(t *testing.T) {
	needMkfs(t)
	const page = 4096
	files := map[string]int{"a-data": 24 * page, "bin/z-tool": 8 * page, "lib/libz.so.1": 8 * page}
	root := t.TempDir()
	for name, size := range files {
		b := make([]byte, size)
		_, _ = rand.Read(b)
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "bin/z-tool"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts func(dir string) []Option
		want map[string]int // resident pages after Get
	}{
		{"default budget", func(string) []Option { return nil },
			map[string]int{"a-data": 24, "bin/z-tool": 8, "lib/libz.so.1": 8}},
		// a-data comes first in path order; the budget goes to the
		// executable and the library.
		{"budget of 16 pages", func(string) []Option { return []Option{WithWarmBudget(16 * page)} },
			map[string]int{"a-data": 0, "bin/z-tool": 8, "lib/libz.so.1": 8}},
		{"no budget", func(string) []Option { return []Option{WithWarmBudget(0)} },
			map[string]int{"a-data": 0, "bin/z-tool": 0, "lib/libz.so.1": 0}},
		{"lazily read blob", func(dir string) []Option {
			return []Option{WithBlobSource(lazyBlobs{LocalBlobs(filepath.Join(dir, BlobsDirName))})}
		}, map[string]int{"a-data": 0, "bin/z-tool": 0, "lib/libz.so.1": 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ctx := context.Background()
			s, err := Open(ctx, dir, tc.opts(dir)...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close(true) })
			l, err := s.CreateLayer(ctx, "data@1", root)
			if err != nil {
				t.Fatal(err)
			}
			if !l.Split() {
				t.Fatalf("layer %+v is not split: the lazy case needs a blob", l)
			}
			img, err := s.Get(ctx, "data@1")
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range tc.want {
				if got := resident(t, filepath.Join(img.Layers[0], name)); got != want {
					t.Errorf("%s: %d pages resident after the mount, want %d", name, got, want)
				}
			}
		})
	}
}
