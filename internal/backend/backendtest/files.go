package backendtest

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

func (st *suite) readFile(t *testing.T, path string, off, limit int64) string {
	t.Helper()
	rc, err := st.s.ReadFile(st.ctx(t), path, off, limit)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

func (st *suite) files(t *testing.T) {
	ctx := st.ctx(t)
	s := st.s
	data := bytes.Repeat([]byte("corral "), 30000) // several frames of any transport
	if n, err := s.WriteFile(ctx, "/work/a/b.txt", bytes.NewReader(data), backend.WriteOptions{Mode: 0o640, MakeParents: true}); err != nil || n != int64(len(data)) {
		t.Fatalf("write: %d, %v", n, err)
	}
	if got := strings.Fields(st.sh(t, "wc -c < /work/a/b.txt; stat -c %a /work/a/b.txt")); len(got) != 2 || got[0] != "210000" || got[1] != "640" {
		t.Errorf("the sandbox sees %q, want 210000 bytes, mode 640", got)
	}
	if _, err := s.WriteFile(ctx, "/work/a/b.txt", strings.NewReader("END"), backend.WriteOptions{Append: true}); err != nil {
		t.Fatal(err)
	}
	if got := st.readFile(t, "/work/a/b.txt", int64(len(data))-3, 0); got != "al END" {
		t.Errorf("read from an offset after append: %q", got)
	}
	if got := st.readFile(t, "/work/a/b.txt", 7, 6); got != "corral" {
		t.Errorf("read with offset 7, limit 6: %q", got)
	}
	st.sh(t, "echo made-inside > /work/c.txt")
	if got := st.readFile(t, "/work/c.txt", 0, 0); got != "made-inside\n" {
		t.Errorf("a file written inside: %q", got)
	}
	if err := s.MakeDir(ctx, "/work/d/e", 0o750, true); err != nil {
		t.Fatal(err)
	}
	ents, err := s.ListDir(ctx, "/work")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name)
	}
	if strings.Join(names, ",") != "a,c.txt,d" {
		t.Errorf("list /work: %v, want a, c.txt, d (sorted)", names)
	}
	fi, err := s.Stat(ctx, "/work/d/e")
	if err != nil || !fi.Mode.IsDir() || fi.Mode.Perm() != 0o750 || fi.Path != "/work/d/e" || fi.Name != "e" {
		t.Errorf("stat of a new dir: %+v %v", fi, err)
	}
	fi, err = s.Stat(ctx, "/work/c.txt")
	if err != nil || fi.Size != 12 || !fi.Mode.IsRegular() || fi.ModTime.IsZero() {
		t.Errorf("stat of a file: %+v %v", fi, err)
	}
	st.sh(t, "ln -s c.txt /work/link")
	if fi, err := s.Stat(ctx, "/work/link"); err != nil || fi.LinkTarget != "c.txt" {
		t.Errorf("stat of a symlink: %+v %v; want LinkTarget c.txt", fi, err)
	}
	if err := s.Remove(ctx, "/work/d", false); err == nil {
		t.Error("non-recursive remove of a non-empty dir succeeded")
	}
	if err := s.Remove(ctx, "/work", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(ctx, "/work"); !errdefs.IsNotFound(err) {
		t.Errorf("/work after remove: %v; want not found", err)
	}
}

// filesTraversal: ".." and symlinks resolve inside the sandbox's root,
// never on the host.
func (st *suite) filesTraversal(t *testing.T) {
	ctx := st.ctx(t)
	s := st.s
	st.sh(t, "mkdir -p /tt && echo inside > /tt/in && ln -sfn / /tt/root && ln -sfn ../../../../.. /tt/up && ln -sfn /etc/passwd /tt/pw")
	defer st.sh(t, "rm -rf /tt")
	if fi, err := s.Stat(ctx, "/tt/root/tt/in"); err != nil || fi.Size != 7 {
		t.Errorf("stat through a symlink to /: %+v %v", fi, err)
	}
	if got := st.readFile(t, "/../../../../tt/in", 0, 0); got != "inside\n" {
		t.Errorf("read with .. above the root: %q", got)
	}
	if got := st.readFile(t, "/tt/up/tt/in", 0, 0); got != "inside\n" {
		t.Errorf("read through a symlink climbing above the root: %q", got)
	}
	// The host's /etc/passwd differs from the image's; what comes back
	// must be the sandbox's.
	inside := st.sh(t, "cat /etc/passwd")
	if got := st.readFile(t, "/tt/pw", 0, 0); got != inside {
		t.Errorf("absolute symlink resolved outside the sandbox: %q", got)
	}
	if got := st.readFile(t, "/tt/up/etc/passwd", 0, 0); got != inside {
		t.Errorf("relative symlink resolved outside the sandbox: %q", got)
	}
	if _, err := s.WriteFile(ctx, "/tt/up/tt/written", strings.NewReader("x"), backend.WriteOptions{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if got := st.sh(t, "cat /tt/written"); got != "x" {
		t.Errorf("write through a climbing symlink landed elsewhere: %q", got)
	}
	if _, err := s.Stat(ctx, "relative/path"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("relative path: %v; want invalid argument", err)
	}
}

func (st *suite) fileErrors(t *testing.T) {
	ctx := st.ctx(t)
	s := st.s
	if _, err := s.ReadFile(ctx, "/no/such/file", 0, 0); !errdefs.IsNotFound(err) {
		t.Errorf("read missing: %v; want not found", err)
	}
	if _, err := s.Stat(ctx, "/no-such-file"); !errdefs.IsNotFound(err) {
		t.Errorf("stat missing: %v; want not found", err)
	}
	if _, err := s.ListDir(ctx, "/no-such-dir"); !errdefs.IsNotFound(err) {
		t.Errorf("list missing: %v; want not found", err)
	}
	if _, err := s.WriteFile(ctx, "/no/parent/f", strings.NewReader("x"), backend.WriteOptions{Mode: 0o644}); !errdefs.IsNotFound(err) {
		t.Errorf("write without parents: %v; want not found", err)
	}
	if err := s.MakeDir(ctx, "/tmp", 0o755, false); !errdefs.IsAlreadyExists(err) {
		t.Errorf("mkdir of an existing dir: %v; want already exists", err)
	}
	if err := s.Remove(ctx, "/no-such-file", false); !errdefs.IsNotFound(err) {
		t.Errorf("remove missing: %v; want not found", err)
	}
}
