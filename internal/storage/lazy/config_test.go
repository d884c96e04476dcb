package lazy

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Bad configuration and bad registrations fail naming the field, and
// leave nothing mounted.
func TestBadInputNamesTheField(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{CacheDir: dir}, "mountpoint"},
		{Config{Mountpoint: filepath.Join(dir, "m")}, "cache_dir"},
		{Config{Mountpoint: filepath.Join(dir, "m"), CacheDir: dir, CacheLimit: -1}, "cache_limit"},
		{Config{Mountpoint: filepath.Join(dir, "m"), CacheDir: dir, HighWatermark: 0.5, LowWatermark: 0.7}, "watermarks"},
		{Config{Mountpoint: filepath.Join(dir, "m"), CacheDir: dir, FetchTimeout: -time.Second}, "fetch_timeout"},
	} {
		_, err := New(context.Background(), c.cfg, localStore(t))
		if !errdefs.IsInvalidArgument(err) || !strings.HasPrefix(err.Error(), c.field+":") {
			t.Errorf("%+v: %v, want invalid argument naming %s", c.cfg, err, c.field)
		}
	}
	assertNotMounted(t, dir)

	f := newFS(t, Config{}, localStore(t))
	for _, c := range []struct {
		digest string
		size   int64
		field  string
	}{
		{"sha256:abc", 1, "digest"},
		{"sha256:" + strings.Repeat("a", 64) + ".chunks", 1, "digest"},
		{"sha256:" + strings.Repeat("a", 64), 0, "size"},
	} {
		if _, err := f.Register(context.Background(), c.digest, c.size); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.field+":") {
			t.Errorf("register %q %d: %v, want invalid argument naming %s", c.digest, c.size, err, c.field)
		}
	}
	if _, err := f.Register(context.Background(), "sha256:"+strings.Repeat("b", 64), 10); !errdefs.IsNotFound(err) {
		t.Errorf("register of a blob the store lacks: %v, want not found", err)
	}
}

// Close refuses while a layer is mounted on one of its files (and keeps
// serving it), and succeeds once the layer is gone.
func TestCloseWhileLayerMounted(t *testing.T) {
	requireRoot(t)
	store := localStore(t)
	l := makeLayer(t, sourceTree(t), store, 1<<20)
	cfg := Config{Mountpoint: filepath.Join(t.TempDir(), "mnt"), CacheDir: filepath.Join(t.TempDir(), "cache")}
	f, err := New(context.Background(), cfg, store)
	if err != nil {
		t.Fatal(err)
	}
	dir := mountLayerNoCleanup(t, f, l)
	unmounted := false
	t.Cleanup(func() {
		if !unmounted {
			_ = unix.Unmount(dir, unix.MNT_DETACH)
			closeFS(t, f)
		}
	})
	if err := f.Close(); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("close under a mounted layer: %v, want failed precondition", err)
	}
	if _, err := sameFile(filepath.Join(l.src, "os.py"), filepath.Join(dir, "os.py")); err != nil {
		t.Fatalf("after a refused close: %v", err)
	}
	unmountNow(t, dir)
	unmounted = true
	closeFS(t, f)
}
