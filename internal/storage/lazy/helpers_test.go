package lazy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/mountinfo"
	"github.com/corral-dev/corral/internal/storage/blob"
)

// layer is a real EROFS image split into local metadata and a data blob
// (mkfs.erofs --chunksize --blobdev), the blob published to a store.
type layer struct {
	src      string // the tree it was made from
	meta     string
	blobPath string
	m        *blob.Manifest
}

var (
	treeOnce sync.Once
	treeDir  string
	treeErr  error
)

// sourceTree is a copy of Debian's Python standard library (about 50 MB of
// files of every size, symlinks included): copied, because a python run
// as root elsewhere may add __pycache__ files to the original meanwhile.
func sourceTree(t *testing.T) string {
	t.Helper()
	treeOnce.Do(func() {
		src := "/usr/lib/python3.11"
		if _, err := os.Stat(src); err != nil {
			treeErr = err
			return
		}
		dir, err := os.MkdirTemp("", "lazyblob-tree-")
		if err != nil {
			treeErr = err
			return
		}
		treeDir = filepath.Join(dir, "tree")
		if out, err := exec.Command("cp", "-a", src, treeDir).CombinedOutput(); err != nil {
			treeErr = err
			t.Logf("cp: %s", out)
		}
	})
	if treeErr != nil {
		t.Fatalf("source tree (needs Debian's python3, scripts/deps.sh installs it): %v", treeErr)
	}
	return treeDir
}

func TestMain(m *testing.M) {
	// Re-executed as a lazy blob server by TestServerOutlivesClients.
	if os.Getenv("CORRAL_LAZYBLOB_TEST_SERVER") == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		err := ServeStdin(ctx, os.Stdin, slog.New(slog.NewTextHandler(os.Stderr, nil)))
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	if treeDir != "" {
		os.RemoveAll(filepath.Dir(treeDir))
	}
	os.Exit(code)
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts FUSE and EROFS")
	}
}

// makeLayer builds the EROFS metadata and blob of src and publishes the
// blob with the given fetch chunk size into store.
func makeLayer(t *testing.T, src string, store blob.Store, chunkSize int64) *layer {
	t.Helper()
	dir := t.TempDir()
	l := &layer{src: src, meta: filepath.Join(dir, "meta.erofs"), blobPath: filepath.Join(dir, "blob")}
	out, err := exec.Command("mkfs.erofs", "--quiet", "-T0", "--chunksize=4096", "--blobdev="+l.blobPath, l.meta, src).CombinedOutput()
	if err != nil {
		t.Fatalf("mkfs.erofs: %v: %s", err, out)
	}
	if l.m, err = blob.Publish(context.Background(), store, l.blobPath, chunkSize); err != nil {
		t.Fatal(err)
	}
	return l
}

// newFS mounts a lazy blob FS in a temp dir; cleanup closes it and checks
// that nothing stays mounted.
func newFS(t *testing.T, cfg Config, store blob.Store) *FS {
	t.Helper()
	if cfg.Mountpoint == "" {
		cfg.Mountpoint = filepath.Join(t.TempDir(), "mnt")
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = filepath.Join(t.TempDir(), "cache")
	}
	f, err := New(context.Background(), cfg, store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeFS(t, f) })
	return f
}

// closeFS closes f; if that fails the test fails, and the mount is
// detached anyway so that nothing outlives the test.
func closeFS(t *testing.T, f *FS) {
	t.Helper()
	if err := f.Close(); err != nil {
		t.Errorf("close: %v", err)
		_ = unix.Unmount(f.cfg.Mountpoint, unix.MNT_DETACH)
	}
	assertNotMounted(t, f.cfg.Mountpoint)
}

func assertNotMounted(t *testing.T, prefix string) {
	t.Helper()
	mounts, err := mountinfo.Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if strings.HasPrefix(m.MountPoint, prefix) {
			t.Errorf("left mounted: %s (%s)", m.MountPoint, m.FSType)
		}
	}
}

// mountLayer mounts l's metadata with the lazy blob file as its device;
// cleanup unmounts it (before the FS closes: cleanups run in reverse).
func mountLayer(t *testing.T, f *FS, l *layer) string {
	t.Helper()
	dir := mountLayerNoCleanup(t, f, l)
	t.Cleanup(func() { unmountNow(t, dir) })
	return dir
}

func mountLayerNoCleanup(t *testing.T, f *FS, l *layer) string {
	t.Helper()
	dev, err := f.Register(context.Background(), l.m.Blob, l.m.Size)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layer")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(l.meta, dir, "erofs", unix.MS_RDONLY, "device="+dev); err != nil {
		t.Fatalf("mount erofs with device=%s: %v", dev, err)
	}
	return dir
}

func unmountNow(t *testing.T, dir string) {
	t.Helper()
	if err := unix.Unmount(dir, 0); err != nil {
		t.Errorf("unmount %s: %v", dir, err)
	}
}

// compareTrees checks that every file, symlink and directory of src reads
// the same under dir, byte for byte; it returns the bytes compared.
func compareTrees(t *testing.T, src, dir string) int64 {
	t.Helper()
	var total int64
	files := 0
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		q := filepath.Join(dir, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			a, _ := os.Readlink(p)
			b, err := os.Readlink(q)
			if err != nil || a != b {
				t.Errorf("symlink %s: %q vs %q (%v)", rel, a, b, err)
			}
		case d.IsDir():
			if st, err := os.Stat(q); err != nil || !st.IsDir() {
				t.Errorf("dir %s: %v", rel, err)
			}
		case d.Type().IsRegular():
			n, err := sameFile(p, q)
			if err != nil {
				t.Errorf("file %s: %v", rel, err)
			}
			total += n
			files++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("only %d files compared", files)
	}
	return total
}

func sameFile(a, b string) (int64, error) {
	fa, err := os.Open(a)
	if err != nil {
		return 0, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return 0, err
	}
	defer fb.Close()
	ba, bb := make([]byte, 256<<10), make([]byte, 256<<10)
	var total int64
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if eb != nil && eb != io.EOF && eb != io.ErrUnexpectedEOF {
			return total, eb
		}
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return total, fmt.Errorf("content differs in the 256 KiB block at %d", total)
		}
		total += int64(na)
		if ea != nil || eb != nil {
			return total, nil
		}
	}
}

// peer serves store over HTTP and returns a peer store reading it.
func peer(t *testing.T, store blob.Store) blob.Store {
	t.Helper()
	srv := httptest.NewServer(blob.Handler(store, nil))
	t.Cleanup(srv.Close)
	return blob.NewHTTP(srv.URL, srv.Client())
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
