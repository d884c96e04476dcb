package upper

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestDirStore(t *testing.T) {
	ctx := context.Background()
	d := DirStore{Root: filepath.Join(t.TempDir(), "uppers")}
	if ids, err := d.IDs(); err != nil || len(ids) != 0 {
		t.Fatalf("IDs of a store never used = %v, %v; want none", ids, err)
	}
	l, err := d.Create(ctx, "a", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if l.IsDevice() || l.UpperDir != filepath.Join(d.Root, "a", "upper") || l.WorkDir != filepath.Join(d.Root, "a", "work") {
		t.Fatalf("layer = %+v; want host dirs under %s/a", l, d.Root)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close of a dir layer: %v", err)
	}
	if _, err := d.Create(ctx, "a", 0, 0); err == nil {
		t.Fatal("a second Create of the same id succeeded")
	}
	if err := os.Mkdir(filepath.Join(d.Root, ".trash"), 0o700); err != nil {
		t.Fatal(err)
	}
	if ids, err := d.IDs(); err != nil || !slices.Equal(ids, []string{"a"}) {
		t.Fatalf("IDs = %v, %v; want [a] (dot directories are no layers)", ids, err)
	}
	loc, err := d.Locate("a")
	if err != nil || loc.Dir != l.UpperDir || loc.Image != "" {
		t.Fatalf("Locate = %+v, %v; want Dir %s", loc, err, l.UpperDir)
	}
	if err := d.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Locate("a"); err == nil {
		t.Fatal("Locate after Remove succeeded")
	}
	if err := d.Remove(ctx, "a"); err != nil {
		t.Fatalf("Remove of a missing layer: %v", err)
	}
}
