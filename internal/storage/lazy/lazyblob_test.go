package lazy

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/storage/blob"
	"github.com/corral-dev/corral/internal/testenv/accept"
)

// counting counts the ranges fetched from its store, per offset.
type counting struct {
	blob.Store
	mu   sync.Mutex
	gets map[int64]int
}

func (c *counting) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	c.mu.Lock()
	if c.gets == nil {
		c.gets = map[int64]int{}
	}
	c.gets[off]++
	c.mu.Unlock()
	return c.Store.GetRange(ctx, key, off, n)
}

func localStore(t *testing.T) *blob.Dir {
	t.Helper()
	d, err := blob.OpenDir(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The whole image read through EROFS on the lazy blob file, fetched from a
// peer node over HTTP, equals the source tree byte for byte.
func TestWholeImageWalkMatchesSource(t *testing.T) {
	requireRoot(t)
	store := localStore(t)
	l := makeLayer(t, sourceTree(t), store, blob.DefaultChunkSize)
	f := newFS(t, Config{}, peer(t, store))
	dir := mountLayer(t, f, l)
	n := compareTrees(t, l.src, dir)
	st, err := f.Stats(l.m.Blob)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("compared %d bytes; stats %+v", n, st)
	if st.ChunksPresent != st.ChunksTotal || st.BytesFetched != l.m.Size {
		t.Errorf("after a whole walk every chunk is fetched exactly once: present %d/%d, fetched %d of %d bytes",
			st.ChunksPresent, st.ChunksTotal, st.BytesFetched, l.m.Size)
	}
	if st.CorruptChunks != 0 || st.FailedFetches != 0 {
		t.Errorf("corrupt %d failed %d", st.CorruptChunks, st.FailedFetches)
	}
}

// Many readers of one missing chunk cause one fetch.
func TestConcurrentReadersFetchOnce(t *testing.T) {
	requireRoot(t)
	store := localStore(t)
	l := makeLayer(t, sourceTree(t), store, 256<<10)
	c := &counting{Store: blob.Throttle(store, &blob.Link{Latency: time.Second})}
	f := newFS(t, Config{}, c)
	path, err := f.Register(context.Background(), l.m.Blob, l.m.Size)
	if err != nil {
		t.Fatal(err)
	}
	chunkOff := 3 * l.m.ChunkSize
	want := make([]byte, 4096)
	src, _ := os.Open(l.blobPath)
	defer src.Close()
	if _, err := src.ReadAt(want, chunkOff+8192); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var bad atomic.Int32
	for range 16 {
		wg.Go(func() {
			fh, err := os.Open(path)
			if err != nil {
				t.Error(err)
				return
			}
			defer fh.Close()
			got := make([]byte, 4096)
			if _, err := fh.ReadAt(got, chunkOff+8192); err != nil || string(got) != string(want) {
				bad.Add(1)
			}
		})
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d readers got wrong data or an error", bad.Load())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gets[chunkOff] != 1 {
		t.Errorf("chunk at %d fetched %d times by 16 concurrent readers, want 1 (all fetches: %v)", chunkOff, c.gets[chunkOff], c.gets)
	}
	st, _ := f.Stats(l.m.Blob)
	if st.Misses < 2 {
		t.Errorf("want several readers to have waited on the one fetch, misses %d", st.Misses)
	}
}

// With a cache far smaller than the image, a whole walk still reads every
// file correctly, the cache stays within its limit and evicted chunks
// become holes in the cache file.
func TestEvictionKeepsFilesCorrect(t *testing.T) {
	requireRoot(t)
	store := localStore(t)
	l := makeLayer(t, sourceTree(t), store, 256<<10)
	limit := int64(4 << 20)
	cfg := Config{CacheLimit: limit, CacheDir: filepath.Join(t.TempDir(), "cache")}
	f := newFS(t, cfg, store)
	dir := mountLayer(t, f, l)
	compareTrees(t, l.src, dir)
	// Eviction runs beside the reads; let the last one finish.
	t.Logf("cache %d bytes before the last eviction", f.CacheBytes())
	if err := f.evictTo(int64(f.cfg.LowWatermark * float64(limit))); err != nil {
		t.Fatal(err)
	}
	if used := f.CacheBytes(); used > limit {
		t.Errorf("cache holds %d bytes, limit %d", used, limit)
	}
	st, _ := f.Stats(l.m.Blob)
	if st.BytesFetched <= l.m.Size {
		t.Errorf("a walk through a %d-byte cache of a %d-byte blob must refetch evicted chunks; fetched %d", limit, l.m.Size, st.BytesFetched)
	}
	var sys syscall.Stat_t
	if err := syscall.Stat(filepath.Join(cfg.CacheDir, l.m.Blob[len("sha256:"):]+".data"), &sys); err != nil {
		t.Fatal(err)
	}
	if alloc := sys.Blocks * 512; alloc > 2*limit {
		t.Errorf("cache file allocates %d bytes for a %d-byte limit: holes not punched", alloc, limit)
	}
	t.Logf("fetched %d bytes for a %d-byte blob; %d chunks present, cache %d bytes", st.BytesFetched, l.m.Size, st.ChunksPresent, f.CacheBytes())
	if st.BytesPresent != f.CacheBytes() || st.BytesPresent == 0 {
		t.Errorf("cache accounting: %d bytes present, %d counted", st.BytesPresent, f.CacheBytes())
	}
}

// A new FS on the same cache dir serves what the old one fetched, with the
// store gone.
func TestRestartKeepsCache(t *testing.T) {
	requireRoot(t)
	store := localStore(t)
	l := makeLayer(t, sourceTree(t), store, blob.DefaultChunkSize)
	cacheDir := filepath.Join(t.TempDir(), "cache")
	mnt := filepath.Join(t.TempDir(), "mnt")
	func() {
		f, err := New(context.Background(), Config{CacheDir: cacheDir, Mountpoint: mnt}, store)
		if err != nil {
			t.Fatal(err)
		}
		defer closeFS(t, f)
		path, err := f.Register(context.Background(), l.m.Blob, l.m.Size)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := readAll(path); err != nil {
			t.Fatal(err)
		}
	}()
	assertNotMounted(t, mnt)
	down := blob.NewHTTP("http://"+closedAddr(t), nil)
	f := newFS(t, Config{CacheDir: cacheDir, Mountpoint: mnt, FetchTimeout: time.Second}, down)
	dir := mountLayer(t, f, l)
	compareTrees(t, l.src, dir)
	st, _ := f.Stats(l.m.Blob)
	if st.BytesFetched != 0 || st.Misses != 0 || st.ChunksPresent != st.ChunksTotal {
		t.Errorf("after a restart the cache must serve everything: %+v", st)
	}
}

func readAll(path string) ([]byte, error) { return os.ReadFile(path) }

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A store that accepts connections and never answers: the reader gets EIO
// within the fetch timeout, the fault is reported, and the FS still serves
// reads of chunks it has.
func TestStoreDownEIOWithinTimeout(t *testing.T) {
	requireRoot(t)
	store := localStore(t)
	l := makeLayer(t, sourceTree(t), store, blob.DefaultChunkSize)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	var connMu sync.Mutex
	accept.Each(ln, func(c net.Conn) {
		connMu.Lock()
		conns = append(conns, c) // held open, never answered
		connMu.Unlock()
	})
	defer func() {
		connMu.Lock()
		for _, c := range conns {
			c.Close()
		}
		connMu.Unlock()
	}()
	// The manifest comes from a reachable store; the data store then hangs.
	sw := &switchable{}
	sw.s.Store(storeBox{store})
	faults := make(chan string, 16)
	timeout := 500 * time.Millisecond
	f := newFS(t, Config{FetchTimeout: timeout, OnFault: func(d string, err error) { faults <- err.Error() }}, sw)
	dir := mountLayer(t, f, l)
	if _, err := os.ReadFile(filepath.Join(dir, "os.py")); err != nil {
		t.Fatal(err)
	}
	sw.s.Store(storeBox{blob.NewHTTP("http://"+ln.Addr().String(), nil)})
	start := time.Now()
	_, err = os.ReadFile(filepath.Join(dir, "pydoc_data", "topics.py")) // large, not yet read
	took := time.Since(start)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("read with the store hanging: %v, want EIO", err)
	}
	// Bounded: the timeout plus slack for a loaded machine, not a hang.
	if took > timeout+10*time.Second {
		t.Errorf("EIO after %v, timeout %v", took, timeout)
	}
	select {
	case reason := <-faults:
		t.Logf("fault after %v: %s", took, reason)
	default:
		t.Error("no fault reported")
	}
	st, _ := f.Stats(l.m.Blob)
	if st.Fault == nil || st.FailedFetches == 0 {
		t.Errorf("stats show no fault: %+v", st)
	}
	// What is cached still reads.
	if _, err := os.ReadFile(filepath.Join(dir, "os.py")); err != nil {
		t.Errorf("cached file with the store down: %v", err)
	}
}

// switchable is a store whose backend a test can replace.
type switchable struct{ s atomic.Value }

type storeBox struct{ blob.Store }

func (w *switchable) cur() blob.Store { return w.s.Load().(storeBox).Store }
func (w *switchable) Stat(ctx context.Context, k string) (int64, error) {
	return w.cur().Stat(ctx, k)
}
func (w *switchable) GetRange(ctx context.Context, k string, off, n int64) (io.ReadCloser, error) {
	return w.cur().GetRange(ctx, k, off, n)
}
func (w *switchable) Put(ctx context.Context, k string, r io.Reader, n int64) error {
	return w.cur().Put(ctx, k, r, n)
}

// corrupting flips a byte in the first `bad` responses for each range.
type corrupting struct {
	blob.Store
	bad  int
	mu   sync.Mutex
	seen map[int64]int
}

func (c *corrupting) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	rc, err := c.Store.GetRange(ctx, key, off, n)
	if err != nil || blob.CheckKey(key) != nil || len(key) > len("sha256:")+64 {
		return rc, err
	}
	c.mu.Lock()
	if c.seen == nil {
		c.seen = map[int64]int{}
	}
	c.seen[off]++
	flip := c.seen[off] <= c.bad
	c.mu.Unlock()
	if !flip {
		return rc, nil
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, err
	}
	b[len(b)/2] ^= 0xff
	return io.NopCloser(bytesReader(b)), nil
}

// A chunk that arrives corrupt is fetched again and the reader gets the
// right bytes; one that never arrives intact is never served (EIO).
func TestCorruptChunkRefetched(t *testing.T) {
	requireRoot(t)
	store := localStore(t)
	l := makeLayer(t, sourceTree(t), store, blob.DefaultChunkSize)
	t.Run("once", func(t *testing.T) {
		f := newFS(t, Config{}, &corrupting{Store: store, bad: 1})
		dir := mountLayer(t, f, l)
		compareTrees(t, l.src, dir)
		st, _ := f.Stats(l.m.Blob)
		if st.CorruptChunks != int64(st.ChunksTotal) || st.FailedFetches != 0 {
			t.Errorf("every chunk was corrupt once and refetched: %+v", st)
		}
	})
	t.Run("always", func(t *testing.T) {
		f := newFS(t, Config{Attempts: 3}, &corrupting{Store: store, bad: 1 << 30})
		path, err := f.Register(context.Background(), l.m.Blob, l.m.Size)
		if err != nil {
			t.Fatal(err)
		}
		fh, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		_, err = fh.ReadAt(make([]byte, 4096), 0)
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("read of a chunk that is always corrupt: %v, want EIO", err)
		}
		st, _ := f.Stats(l.m.Blob)
		if st.CorruptChunks != 3 || st.ChunksPresent != 0 || st.Fault == nil {
			t.Errorf("want 3 corrupt attempts, nothing cached, a fault: %+v", st)
		}
	})
}

// The chunks a start reads are recorded as a hint; a later start on a cold
// cache prefetches them and then reads only from the cache.
func TestPrefetchHintReplay(t *testing.T) {
	requireRoot(t)
	store := localStore(t)
	l := makeLayer(t, sourceTree(t), store, 256<<10)
	files := []string{"os.py", "json/__init__.py", "json/decoder.py", "sqlite3/__init__.py", "collections/__init__.py"}
	readFiles := func(dir string) {
		for _, name := range files {
			if _, err := sameFile(filepath.Join(l.src, name), filepath.Join(dir, name)); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
	}
	cacheDir := filepath.Join(t.TempDir(), "cache")
	var hint []int
	t.Run("record", func(t *testing.T) {
		f := newFS(t, Config{CacheDir: cacheDir}, store)
		dir := mountLayer(t, f, l)
		stop, err := f.Record(l.m.Blob)
		if err != nil {
			t.Fatal(err)
		}
		readFiles(dir)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if hint, err = f.Hint(l.m.Blob); err != nil || len(hint) == 0 {
			t.Fatalf("hint %v, %v", hint, err)
		}
	})
	// A cold cache that has the hint (a node keeps hints apart from chunks).
	cold := filepath.Join(t.TempDir(), "cold")
	if err := os.MkdirAll(cold, 0o700); err != nil {
		t.Fatal(err)
	}
	hex := l.m.Blob[len("sha256:"):]
	raw, err := os.ReadFile(filepath.Join(cacheDir, hex+".hint"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cold, hex+".hint"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFS(t, Config{CacheDir: cold}, store)
	dir := mountLayer(t, f, l)
	if err := f.Prefetch(context.Background(), l.m.Blob, PrefetchHint); err != nil {
		t.Fatal(err)
	}
	st0, _ := f.Stats(l.m.Blob)
	if st0.ChunksPresent != len(hint) || st0.BytesPrefetch == 0 {
		t.Errorf("prefetch of a %d-chunk hint: %+v", len(hint), st0)
	}
	readFiles(dir)
	st, _ := f.Stats(l.m.Blob)
	if st.Misses != 0 || st.BytesFetched != st0.BytesFetched {
		t.Errorf("reads after the hint's prefetch must all hit: %+v", st)
	}
	// A whole prefetch fetches the rest and yields nothing wrong.
	if err := f.Prefetch(context.Background(), l.m.Blob, PrefetchWhole); err != nil {
		t.Fatal(err)
	}
	st, _ = f.Stats(l.m.Blob)
	if st.ChunksPresent != st.ChunksTotal || st.BytesFetched != l.m.Size {
		t.Errorf("whole prefetch: %+v", st)
	}
	compareTrees(t, l.src, dir)
}

// Reads are counted for the group Attribute names for the reading pid:
// here a process's command name, for two host programs reading different
// files of the layer.
func TestReadsAttributedToGroups(t *testing.T) {
	requireRoot(t)
	store := localStore(t)
	l := makeLayer(t, sourceTree(t), store, 256<<10)
	comm := func(pid uint32) string {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/comm")
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	f := newFS(t, Config{Attribute: comm}, store)
	dir := mountLayer(t, f, l)
	for _, c := range [][]string{
		{"cat", filepath.Join(dir, "pydoc_data", "topics.py")},
		{"dd", "if=" + filepath.Join(dir, "_pydecimal.py"), "of=/dev/null", "status=none"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %.200s", c[0], err, out)
		}
	}
	for _, c := range []struct {
		group string
		file  string
	}{{"cat", "pydoc_data/topics.py"}, {"dd", "_pydecimal.py"}} {
		st, err := os.Stat(filepath.Join(l.src, c.file))
		if err != nil {
			t.Fatal(err)
		}
		g := f.GroupStats(c.group)
		// EROFS reads whole blocks and reads ahead: at least the file, not
		// wildly more.
		if g.BytesRead < st.Size() || g.BytesRead > st.Size()+4<<20 || g.Misses == 0 || g.BytesFetched == 0 {
			t.Errorf("%s read %s (%d bytes): %+v", c.group, c.file, st.Size(), g)
		}
	}
	f.ForgetGroup("cat")
	if g := f.GroupStats("cat"); g.BytesRead != 0 {
		t.Errorf("after ForgetGroup: %+v", g)
	}
}

// A sandbox's root is an overlay over its layers: one over a layer whose
// blob is a lazy file mounts (the stacking depth allows it), reads the
// layer's files and takes writes in its upper dir.
func TestOverlayOverLazyLayer(t *testing.T) {
	requireRoot(t)
	store := localStore(t)
	l := makeLayer(t, sourceTree(t), store, blob.DefaultChunkSize)
	f := newFS(t, Config{}, store)
	lower := mountLayer(t, f, l)
	base := t.TempDir()
	upper, work, merged := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := syscall.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Fatalf("overlay over the lazy layer: %v", err)
	}
	defer func() {
		if err := syscall.Unmount(merged, 0); err != nil {
			t.Errorf("unmount overlay: %v", err)
		}
	}()
	if _, err := sameFile(filepath.Join(l.src, "os.py"), filepath.Join(merged, "os.py")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(merged, "os.py"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(upper, "os.py")); err != nil || string(b) != "changed" {
		t.Errorf("write went to %q, %v; want the upper dir", b, err)
	}
}

// The blob files are root's, yet any user reads a mounted layer's files:
// EROFS opened the blob as the mounting node, readers never open it.
func TestUnprivilegedReaderThroughLayer(t *testing.T) {
	requireRoot(t)
	store := localStore(t)
	l := makeLayer(t, sourceTree(t), store, blob.DefaultChunkSize)
	f := newFS(t, Config{}, store)
	dir := mountLayer(t, f, l)
	// t.TempDir is 0700: open the way to the layer and to the FUSE mount,
	// so that only the mount's own modes can refuse.
	for _, leaf := range []string{dir, f.cfg.Mountpoint} {
		for p := filepath.Dir(leaf); p != os.TempDir(); p = filepath.Dir(p) {
			if err := os.Chmod(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	nobody := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cat := exec.Command("cat", filepath.Join(dir, "json", "decoder.py"))
	cat.SysProcAttr = nobody
	got, err := cat.Output()
	want, _ := os.ReadFile(filepath.Join(l.src, "json", "decoder.py"))
	if err != nil || string(got) != string(want) {
		t.Fatalf("nobody reading a layer file: %d bytes, %v", len(got), err)
	}
	blobFile := exec.Command("cat", f.Path(l.m.Blob))
	blobFile.SysProcAttr = nobody
	if out, err := blobFile.CombinedOutput(); err == nil {
		t.Errorf("nobody read the blob file itself (%d bytes)", len(out))
	}
}
