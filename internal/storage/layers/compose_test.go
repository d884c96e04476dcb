package layers

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

func mustLayer(t *testing.T, s *Store, ref string, files map[string]string) Layer {
	t.Helper()
	l, err := s.CreateLayer(context.Background(), ref, tree(t, files))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// overlayOf mounts img read-only as a sandbox's lower layers would be.
func overlayOf(t *testing.T, img Image) string {
	t.Helper()
	root := t.TempDir()
	if err := unix.Mount("overlay", root, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(img.Layers, ":")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	return root
}

func readIn(t *testing.T, root, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, p))
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// TestComposition: base, workspace and a toolkit that the composition
// follows by name; a new toolkit version upgrades the composition without
// touching it, a pinned reference stays.
func TestComposition(t *testing.T) {
	needMkfs(t)
	s, _ := openStore(t)
	ctx := context.Background()
	mustLayer(t, s, "base@1", map[string]string{"etc/os": "base\n", "shared": "base\n"})
	mustLayer(t, s, "ws@1", map[string]string{"repo/main.py": "print(1)\n", "shared": "ws\n"})
	mustLayer(t, s, "tool@1", map[string]string{"opt/tool": "v1\n"})
	c, err := s.CreateComposition(ctx, Composition{Ref: "task@1", Layers: []string{"base@1", "ws@1", "tool"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Env) == 0 {
		t.Fatalf("no default env: %+v", c)
	}
	pinned, err := s.CreateComposition(ctx, Composition{Ref: "task-pinned@1", Layers: []string{"base@1", "ws@1", "tool@1"}})
	if err != nil {
		t.Fatal(err)
	}
	img, err := s.Get(ctx, "task@1")
	if err != nil {
		t.Fatal(err)
	}
	root := overlayOf(t, img)
	for p, want := range map[string]string{"etc/os": "base\n", "shared": "ws\n", "repo/main.py": "print(1)\n", "opt/tool": "v1\n"} {
		if got := readIn(t, root, p); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	mustLayer(t, s, "tool@2", map[string]string{"opt/tool": "v2\n"})
	for ref, want := range map[string]string{"task@1": "v2\n", "task-pinned@1": "v1\n"} {
		img, err := s.Get(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if got := readIn(t, overlayOf(t, img), "opt/tool"); got != want {
			t.Errorf("%s: opt/tool = %q, want %q", ref, got, want)
		}
	}
	// Immutable; same content is fine; bad input names the field.
	if _, err := s.CreateComposition(ctx, pinned); err != nil {
		t.Fatal(err)
	}
	_, err = s.CreateComposition(ctx, Composition{Ref: "task@1", Layers: []string{"base@1"}})
	wantErr(t, err, errdefs.ErrAlreadyExists, "task@1 exists")
	_, err = s.CreateComposition(ctx, Composition{Ref: "x@1", Layers: []string{"base@1", "nope@3"}})
	wantErr(t, err, errdefs.ErrNotFound, "layers[1]: layer nope@3 not found")
	_, err = s.CreateComposition(ctx, Composition{Ref: "x@1", Layers: []string{"Bad Ref"}})
	wantErr(t, err, errdefs.ErrInvalidArgument, "layers[0]")
	_, err = s.CreateComposition(ctx, Composition{Ref: "x", Layers: []string{"base@1"}})
	wantErr(t, err, errdefs.ErrInvalidArgument, "name: ")
	comps, err := s.Compositions(ctx)
	if err != nil || len(comps) != 2 || comps[0].Ref != "task-pinned@1" {
		t.Fatalf("compositions %+v %v", comps, err)
	}
	// A single layer is an image too.
	img, err = s.Get(ctx, "tool")
	if err != nil || len(img.Stack) != 1 || img.Stack[0].Ref != "tool@2" {
		t.Fatalf("tool: %+v %v", img, err)
	}
}

// TestRemoveInUse: a layer a sandbox or a composition uses cannot be
// removed, and the error says who uses it; once unused it goes with its
// files and mount.
func TestRemoveInUse(t *testing.T) {
	needMkfs(t)
	s, _ := openStore(t)
	ctx := context.Background()
	base := mustLayer(t, s, "base@1", map[string]string{"f": "base\n"})
	mustLayer(t, s, "base@2", map[string]string{"f": "base2\n"})
	mustLayer(t, s, "ws@1", map[string]string{"w": "ws\n"})
	if _, err := s.CreateComposition(ctx, Composition{Ref: "env@1", Layers: []string{"base@1", "ws@1"}}); err != nil {
		t.Fatal(err)
	}
	img, err := s.Acquire(ctx, "base@1", "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Remove(ctx, "base@1")
	wantErr(t, err, errdefs.ErrFailedPrecondition, "in use by composition env@1, sandbox sb-1")
	if _, err := s.Remove(ctx, "env@1"); err != nil {
		t.Fatal(err)
	}
	_, err = s.Remove(ctx, "base@1")
	wantErr(t, err, errdefs.ErrFailedPrecondition, "in use by sandbox sb-1")
	assertMounted(t, img.Layers[0], true)
	s.Release("sb-1")
	rm, err := s.Remove(ctx, "base@1")
	if err != nil {
		t.Fatal(err)
	}
	if len(rm.Deleted) != 1 || rm.Deleted[0] != base.Digest || rm.FreedBytes < base.MetaSize {
		t.Fatalf("removed %+v", rm)
	}
	assertMounted(t, img.Layers[0], false)
	for _, p := range []string{s.metaFile(base.Digest), s.blobFile(base.BlobDigest), img.Layers[0]} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left: %v", p, err)
		}
	}
	_, err = s.Remove(ctx, "base@1")
	wantErr(t, err, errdefs.ErrNotFound, "base@1")
	// The latest version of a name is kept by nothing but itself: removable.
	if _, err := s.Remove(ctx, "ws@1"); err != nil {
		t.Fatal(err)
	}

	// A layer and a composition of one name (what pack makes) go together;
	// refused, neither goes.
	mustLayer(t, s, "br@1", map[string]string{"b": "1"})
	if _, err := s.CreateComposition(ctx, Composition{Ref: "br@1", Layers: []string{"base@2", "br@1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "br@1", "sb-2"); err != nil {
		t.Fatal(err)
	}
	_, err = s.Remove(ctx, "br@1")
	wantErr(t, err, errdefs.ErrFailedPrecondition, "in use by sandbox sb-2")
	if _, err := s.Get(ctx, "br@1"); err != nil {
		t.Fatalf("a refused remove removed the composition: %v", err)
	}
	s.Release("sb-2")
	rm, err = s.Remove(ctx, "br@1")
	if err != nil || len(rm.Compositions) != 1 || len(rm.Layers) != 1 {
		t.Fatalf("remove br@1: %+v %v", rm, err)
	}
}

// TestGC removes exactly the layers nothing uses: not the latest version
// of a name, not one a composition or a sandbox uses, not a digest that
// another used reference shares; and files the index does not name.
func TestGC(t *testing.T) {
	needMkfs(t)
	s, dir := openStore(t)
	ctx := context.Background()
	old := mustLayer(t, s, "a@1", map[string]string{"a": "1"})
	mustLayer(t, s, "a@2", map[string]string{"a": "2"})
	mustLayer(t, s, "b@1", map[string]string{"b": "1"})
	mustLayer(t, s, "b@2", map[string]string{"b": "2"})
	mustLayer(t, s, "c@1", map[string]string{"c": "1"})
	mustLayer(t, s, "c@2", map[string]string{"c": "2"})
	mustLayer(t, s, "d@1", map[string]string{"same": "x"})
	mustLayer(t, s, "e@1", map[string]string{"same": "x"}) // d@1's digest
	mustLayer(t, s, "d@2", map[string]string{"d": "2"})
	if _, err := s.CreateComposition(ctx, Composition{Ref: "env@1", Layers: []string{"b@1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "c@1", "sb-1"); err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(dir, "blobs", "sha256-"+strings.Repeat("1", 64)+".blob")
	if err := os.WriteFile(stray, []byte("left by a crash"), 0o444); err != nil {
		t.Fatal(err)
	}
	rm, err := s.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, l := range rm.Layers {
		refs = append(refs, l.Ref)
	}
	if !slices.Equal(refs, []string{"a@1"}) || !slices.Equal(rm.Deleted, []string{old.Digest}) {
		t.Fatalf("gc removed %v (digests %v), want a@1 only", refs, rm.Deleted)
	}
	if _, err := os.Stat(stray); !os.IsNotExist(err) {
		t.Fatalf("stray blob kept: %v", err)
	}
	layers, _ := s.Layers(ctx)
	var left []string
	for _, l := range layers {
		left = append(left, l.Ref)
	}
	sort.Strings(left)
	if want := []string{"a@2", "b@1", "b@2", "c@1", "c@2", "d@1", "d@2", "e@1"}; !slices.Equal(left, want) {
		t.Fatalf("left %v, want %v", left, want)
	}
	// Once the sandbox is gone and the composition removed, their layers go.
	s.Release("sb-1")
	if _, err := s.Remove(ctx, "env@1"); err != nil {
		t.Fatal(err)
	}
	rm, err = s.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	refs = refs[:0]
	for _, l := range rm.Layers {
		refs = append(refs, l.Ref)
	}
	if !slices.Equal(refs, []string{"b@1", "c@1"}) {
		t.Fatalf("second gc removed %v, want b@1 c@1", refs)
	}
	if rm, err := s.GC(ctx); err != nil || len(rm.Layers)+len(rm.Deleted) != 0 {
		t.Fatalf("third gc removed %+v %v", rm, err)
	}
}

// TestGCKeepsPinnedReplacedDigest: a rebuild points a ref at new content;
// the old content stays while a sandbox uses it and goes at the next GC
// after.
func TestGCKeepsPinnedReplacedDigest(t *testing.T) {
	needMkfs(t)
	s, _ := openStore(t)
	ctx := context.Background()
	old := mustLayer(t, s, "x@1", map[string]string{"v": "1"})
	img, err := s.Acquire(ctx, "x@1", "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.createLayer(ctx, "x@1", tree(t, map[string]string{"v": "2"}), true, mkfsOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readIn(t, img.Layers[0], "v"); got != "1" {
		t.Fatalf("pinned old content: %q", got)
	}
	if _, err := os.Stat(s.blobFile(old.BlobDigest)); err != nil {
		t.Fatalf("pinned blob deleted: %v", err)
	}
	s.Release("sb-1")
	rm, err := s.GC(ctx)
	if err != nil || !slices.Contains(rm.Deleted, old.Digest) {
		t.Fatalf("gc after release: %+v %v", rm, err)
	}
	for _, p := range []string{s.metaFile(old.Digest), s.blobFile(old.BlobDigest)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left: %v", p, err)
		}
	}
	assertMounted(t, img.Layers[0], false)
}
