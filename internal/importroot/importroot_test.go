package importroot

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestOpenStaysBeneath: "..", absolute and relative symlinks out of the
// root and /proc magic links are refused; paths inside, and symlinks that
// stay inside, open.
func TestOpenStaysBeneath(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "root")
	must(t, os.MkdirAll(filepath.Join(dir, "tree", "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(base, "secret"), []byte("s"), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "tree", "f"), []byte("f"), 0o644))
	must(t, os.Symlink("/etc", filepath.Join(dir, "abs")))
	must(t, os.Symlink("../secret", filepath.Join(dir, "rel")))
	must(t, os.Symlink("tree/f", filepath.Join(dir, "inside")))
	must(t, os.Symlink("/proc/self/root/etc", filepath.Join(dir, "magic")))
	r, err := New(dir)
	must(t, err)
	for _, p := range []string{"../secret", dir + "/../secret", dir + "/tree/../../secret", "abs", "abs/passwd", "rel", "tree/sub/../../../secret", "magic"} {
		_, err := r.Open("path", p)
		if !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("%s: %v, want permission denied", p, err)
		}
	}
	if _, err := r.Open("path", "/etc"); err == nil || !strings.Contains(err.Error(), "not under the import root") {
		t.Errorf("/etc: %v", err)
	}
	for _, p := range []string{"inside", dir + "/tree/f", "tree/sub/../f", dir} {
		f, err := r.Open("path", p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		f.Close()
	}
	var none *Root
	if _, err := none.Open("path", dir); err == nil || !strings.Contains(err.Error(), Flag) {
		t.Errorf("no root: %v", err)
	}
}

// TestTarReadsTheTree: Tar records a symlink in the tree as a symlink,
// never reading what it points at.
func TestTarReadsTheTree(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "f"), []byte("data"), 0o644))
	must(t, os.Symlink("/etc/shadow", filepath.Join(dir, "l")))
	r, err := New(dir)
	must(t, err)
	f, err := r.Open("path", dir)
	must(t, err)
	rc := Tar(context.Background(), f)
	defer rc.Close()
	tr := tar.NewReader(rc)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		b, _ := io.ReadAll(tr)
		got[h.Name] = string(h.Typeflag) + h.Linkname + string(b)
	}
	if got["f"] != "0data" || got["l"] != "2/etc/shadow" || len(got) != 3 {
		t.Fatalf("entries %q", got)
	}
}
