package layers

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

// TestPackBudget: a tree whose sparse files read as far more than it
// stores is refused with ResourceExhausted naming the file; stored data,
// and sparse files under an excluded path, pass.
func TestPackBudget(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "data"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := packBudget(ctx, dir, nil); err != nil || n != 1<<20 {
		t.Fatalf("stored file: %d bytes, %v", n, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	sparse := func(p string) {
		f, err := os.Create(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(1 << 30); err != nil {
			t.Fatal(err)
		}
	}
	sparse("tmp/hole")
	res, err := excludeRegexps(PackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := packBudget(ctx, dir, res); err != nil {
		t.Fatalf("sparse file under excluded /tmp: %v", err)
	}
	sparse("hole")
	_, err = packBudget(ctx, dir, res)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "/hole") {
		t.Fatalf("1 GiB sparse file: %v, want resource exhausted naming /hole", err)
	}
}
