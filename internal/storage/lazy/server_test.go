package lazy

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/blob"
)

// serverLayer is a layer of sourceTree in a directory blob store for a
// server test (root only): the store's dir, the layer, and a dir for the
// server's mount point, cache and socket.
func serverLayer(t *testing.T) (storeDir string, l *layer, dir string) {
	requireRoot(t)
	storeDir = filepath.Join(t.TempDir(), "store")
	store, err := blob.OpenDir(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	return storeDir, makeLayer(t, sourceTree(t), store, 512<<10), t.TempDir()
}

// The FS runs in a server process of its own: a second client (a
// restarted daemon) finds the same server and the same files, layers keep
// reading, figures come over the socket, and Shutdown refuses while a
// layer is mounted and ends the server once none is.
func TestServerOutlivesClients(t *testing.T) {
	storeDir, l, dir := serverLayer(t)
	sc := ServerConfig{
		Config:           Config{Mountpoint: filepath.Join(dir, "mnt"), CacheDir: filepath.Join(dir, "cache")},
		Store:            blob.Config{Kind: "dir", Dir: storeDir},
		Socket:           filepath.Join(dir, "lazyblob.sock"),
		AttributeCgroups: true,
	}
	argv := []string{os.Args[0], "-test.run=^$"}
	env := append(os.Environ(), "CORRAL_LAZYBLOB_TEST_SERVER=1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Start(ctx, sc, argv, env, filepath.Join(dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := c.Pid(ctx)
	if err != nil {
		t.Fatal(err)
	}
	layerDir := ""
	t.Cleanup(func() { // whatever happened: no server, no mount left
		if layerDir != "" {
			_ = syscall.Unmount(layerDir, syscall.MNT_DETACH)
		}
		if syscall.Kill(pid, 0) == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			_ = syscall.Unmount(sc.Mountpoint, syscall.MNT_DETACH)
		}
		assertNotMounted(t, dir)
	})
	if pid == os.Getpid() {
		t.Fatal("the server runs in the test process")
	}
	path, err := c.Register(ctx, l.m.Blob, l.m.Size)
	if err != nil {
		t.Fatal(err)
	}
	layerDir = filepath.Join(dir, "layer")
	if err := os.Mkdir(layerDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(l.meta, layerDir, "erofs", syscall.MS_RDONLY, "device="+path); err != nil {
		t.Fatal(err)
	}
	if _, err := sameFile(filepath.Join(l.src, "os.py"), filepath.Join(layerDir, "os.py")); err != nil {
		t.Fatal(err)
	}

	// A restarted daemon: a new client, the same server and file.
	c2, err := Start(ctx, sc, argv, env, filepath.Join(dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	if pid2, _ := c2.Pid(ctx); pid2 != pid {
		t.Fatalf("second Start started another server (pid %d, was %d)", pid2, pid)
	}
	if p2, err := c2.Register(ctx, l.m.Blob, l.m.Size); err != nil || p2 != path {
		t.Fatalf("register again: %q, %v; want %q", p2, err, path)
	}
	compareTrees(t, l.src, layerDir)
	st, err := c2.Stats(ctx, l.m.Blob)
	if err != nil || st.ChunksPresent != st.ChunksTotal || st.BytesFetched != l.m.Size {
		t.Errorf("stats over the socket: %+v, %v", st, err)
	}
	g, err := c2.GroupStats(ctx, CgroupOf(uint32(os.Getpid())))
	if err != nil || g.BytesRead < l.m.Size/2 {
		t.Errorf("reads of this test's cgroup %q: %+v, %v", CgroupOf(uint32(os.Getpid())), g, err)
	}
	metrics, err := c2.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# TYPE corral_lazyblob_bytes_fetched_total counter",
		"corral_lazyblob_bytes_fetched_total{blob=\"" + l.m.Blob + "\"} " + strconv.FormatInt(l.m.Size, 10) + "\n",
		"corral_lazyblob_degraded{blob=\"" + l.m.Blob + "\"} 0\n",
		"corral_lazyblob_group_bytes_read_total{group=",
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %q:\n%s", want, metrics)
		}
	}
	if faults, err := c2.Faults(ctx, 0); err != nil || len(faults) != 0 {
		t.Errorf("faults: %v, %v", faults, err)
	}
	if _, err := c2.Register(ctx, "sha256:bad", 1); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad digest over the socket: %v, want invalid argument", err)
	}

	if err := c2.Shutdown(ctx); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("shutdown under a mounted layer: %v, want failed precondition", err)
	}
	if err := syscall.Unmount(layerDir, 0); err != nil {
		t.Fatal(err)
	}
	layerDir = ""
	if err := c2.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for syscall.Kill(pid, 0) == nil {
		if ctx.Err() != nil {
			t.Fatal("server did not exit after Shutdown")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A server killed outright leaves a dead FUSE mount; the next Start runs a
// new server over it that serves from the cache the dead one filled.
func TestServerRestartAfterCrash(t *testing.T) {
	storeDir, l, dir := serverLayer(t)
	sc := ServerConfig{
		Config: Config{Mountpoint: filepath.Join(dir, "mnt"), CacheDir: filepath.Join(dir, "cache"), FlushInterval: 50 * time.Millisecond},
		Store:  blob.Config{Kind: "dir", Dir: storeDir},
		Socket: filepath.Join(dir, "lazyblob.sock"),
	}
	argv := []string{os.Args[0], "-test.run=^$"}
	env := append(os.Environ(), "CORRAL_LAZYBLOB_TEST_SERVER=1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var pids []int
	t.Cleanup(func() {
		for _, pid := range pids {
			if syscall.Kill(pid, 0) == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = syscall.Unmount(sc.Mountpoint, syscall.MNT_DETACH)
		assertNotMounted(t, dir)
	})
	start := func() (*Client, string) {
		c, err := Start(ctx, sc, argv, env, filepath.Join(dir, "server.log"))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := c.Pid(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
		path, err := c.Register(ctx, l.m.Blob, l.m.Size)
		if err != nil {
			t.Fatal(err)
		}
		return c, path
	}
	want, err := os.ReadFile(l.blobPath)
	if err != nil {
		t.Fatal(err)
	}
	_, path := start()
	if got, err := os.ReadFile(path); err != nil || string(got) != string(want) {
		t.Fatalf("read through the first server: %d bytes, %v", len(got), err)
	}
	time.Sleep(200 * time.Millisecond) // a flush: the bitmap on disk
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for syscall.Kill(pids[0], 0) == nil {
		time.Sleep(10 * time.Millisecond)
	}
	c, path := start()
	if got, err := os.ReadFile(path); err != nil || string(got) != string(want) {
		t.Fatalf("read through the restarted server: %d bytes, %v", len(got), err)
	}
	st, err := c.Stats(ctx, l.m.Blob)
	if err != nil || st.BytesFetched != 0 {
		t.Errorf("the restarted server must serve the cache: %+v, %v", st, err)
	}
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}
