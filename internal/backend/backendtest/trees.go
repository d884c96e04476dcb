package backendtest

import (
	"archive/tar"
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// TarEntry is one entry of a tar stream made by TarOf.
type TarEntry struct {
	Hdr  tar.Header
	Body string
}

// conformanceTree has what a tree copy must keep: nested directories,
// modes with set-id bits, owners, mtimes, a symlink, a hard link, a user
// xattr and a file spanning several frames of any transport.
func conformanceTree() []TarEntry {
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	big := strings.Repeat("0123456789abcdef", 20000) // 320 KB
	return []TarEntry{
		{Hdr: tar.Header{Name: "t/", Typeflag: tar.TypeDir, Mode: 0o750, ModTime: mtime}},
		{Hdr: tar.Header{Name: "t/d/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime, Uid: 65534, Gid: 65534}},
		{Hdr: tar.Header{Name: "t/d/big", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: mtime}, Body: big},
		{Hdr: tar.Header{Name: "t/a", Typeflag: tar.TypeReg, Mode: 0o2755, ModTime: mtime, Uid: 65534, Gid: 65534,
			PAXRecords: map[string]string{"SCHILY.xattr.user.corral": "yes"}}, Body: "alpha\n"},
		{Hdr: tar.Header{Name: "t/l", Typeflag: tar.TypeSymlink, Linkname: "a", ModTime: mtime}},
		{Hdr: tar.Header{Name: "t/h", Typeflag: tar.TypeLink, Linkname: "t/a"}},
	}
}

// TarOf is a tar stream of es, each entry's size its body's (none for
// other than regular files), in PAX format where an entry has records.
func TarOf(t *testing.T, es ...TarEntry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := e.Hdr
		h.Size = int64(len(e.Body))
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if len(h.PAXRecords) > 0 {
			h.Format = tar.FormatPAX
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.Body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// trees: a tar stream goes in and comes out with its metadata, on every
// backend that copies trees; one that does not says so with NotSupported.
func (st *suite) trees(t *testing.T) {
	tr, err := backend.TreesOf(st.s)
	if errdefs.IsNotSupported(err) {
		t.Skipf("backend has no tree copy: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx := st.ctx(t)
	es := conformanceTree()
	entries, n, err := tr.CopyIn(ctx, "/ct/in", TarOf(t, es...))
	if err != nil {
		t.Fatalf("copy in: %v", err)
	}
	defer st.sh(t, "rm -rf /ct")
	wantBytes := int64(len(es[2].Body) + len(es[3].Body))
	if entries != int64(len(es)) || n != wantBytes {
		t.Errorf("copy in: %d entries, %d bytes; want %d, %d", entries, n, len(es), wantBytes)
	}
	// As the sandbox sees it.
	got := st.sh(t, "cd /ct/in/t && stat -c '%n %a %u:%g %h %Y' . d a h && readlink l && cat a && wc -c < d/big")
	want := "." + " 750 0:0 3 981173106\nd 755 65534:65534 2 981173106\na 2755 65534:65534 2 981173106\nh 2755 65534:65534 2 981173106\na\nalpha\n320000\n"
	if got != want {
		t.Errorf("in the sandbox:\n%s\nwant:\n%s", got, want)
	}
	// And back: the same entries, links kept (a hard link to what came first).
	var out bytes.Buffer
	if err := tr.CopyOut(ctx, "/ct/in/t", &out); err != nil {
		t.Fatalf("copy out: %v", err)
	}
	back := map[string]*tar.Header{}
	bodies := map[string]string{}
	rd := tar.NewReader(&out)
	for {
		h, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("copy out: read tar: %v", err)
		}
		b, _ := io.ReadAll(rd)
		name := strings.TrimSuffix(h.Name, "/")
		back[name], bodies[name] = h, string(b)
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range back {
			if !yield(k) {
				return
			}
		}
	})
	if strings.Join(names, ",") != "t,t/a,t/d,t/d/big,t/h,t/l" {
		t.Fatalf("copy out has %v", names)
	}
	if h := back["t/l"]; h.Typeflag != tar.TypeSymlink || h.Linkname != "a" {
		t.Errorf("symlink came back as %+v", h)
	}
	a, hl := back["t/a"], back["t/h"]
	if a.Typeflag == tar.TypeLink { // whichever of the two came first is the file
		a, hl = hl, a
	}
	if hl.Typeflag != tar.TypeLink || !slices.Contains([]string{"t/a", "t/h"}, hl.Linkname) {
		t.Errorf("hard link came back as %+v", hl)
	}
	if a.Mode&0o7777 != 0o2755 || a.Uid != 65534 || !a.ModTime.Equal(es[3].Hdr.ModTime) ||
		a.PAXRecords["SCHILY.xattr.user.corral"] != "yes" || bodies[a.Name] != "alpha\n" {
		t.Errorf("file came back as %+v with %q", a, bodies[a.Name])
	}
	if bodies["t/d/big"] != es[2].Body {
		t.Errorf("big file came back with %d bytes, not as sent", len(bodies["t/d/big"]))
	}
	st.treesStayInside(t, tr)
}

// treesStayInside: ".." and absolute names land below the destination,
// an archived symlink is never followed out of the root, a hard link to
// a path outside the sandbox is not found, and a device or a stream that
// is no tar is refused.
func (st *suite) treesStayInside(t *testing.T, tr backend.Trees) {
	ctx := st.ctx(t)
	in := func(es ...TarEntry) error {
		_, _, err := tr.CopyIn(ctx, "/ct/x", TarOf(t, es...))
		return err
	}
	for _, es := range [][]TarEntry{
		{{Hdr: tar.Header{Name: "../../../../up", Typeflag: tar.TypeReg, Mode: 0o644}, Body: "x"}},
		{{Hdr: tar.Header{Name: "/abs", Typeflag: tar.TypeReg, Mode: 0o644}, Body: "x"}},
		{{Hdr: tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "/"}},
			{Hdr: tar.Header{Name: "out/through", Typeflag: tar.TypeReg, Mode: 0o644}, Body: "x"}},
	} {
		if err := in(es...); err != nil {
			t.Errorf("copy in %s: %v", es[len(es)-1].Hdr.Name, err)
		}
	}
	st.sh(t, "test -f /ct/x/up && test -f /ct/x/abs && test -L /ct/x/out && test -f /through && rm /through && ! test -e /up && ! test -e /abs")
	err := in(TarEntry{Hdr: tar.Header{Name: "hard", Typeflag: tar.TypeLink, Linkname: "../../../nowhere/at/all"}})
	if !errdefs.IsNotFound(err) {
		t.Errorf("hard link to a missing target: %v; want not found", err)
	}
	err = in(TarEntry{Hdr: tar.Header{Name: "dev", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "is not supported") {
		t.Errorf("a device entry: %v; want invalid argument", err)
	}
	if err := tr.CopyOut(ctx, "/ct/no/such", io.Discard); !errdefs.IsNotFound(err) {
		t.Errorf("copy out of a missing path: %v; want not found", err)
	}
	// A broken stream is refused, and the sandbox stays usable.
	if err := in(TarEntry{Hdr: tar.Header{Name: "ok", Typeflag: tar.TypeReg, Mode: 0o644}, Body: "x"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tr.CopyIn(ctx, "/ct/x", strings.NewReader(strings.Repeat("garbage!", 200))); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a stream that is no tar: %v; want invalid argument", err)
	}
	st.sh(t, "test -f /ct/x/ok")
}
