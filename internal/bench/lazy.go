package bench

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/seaweed"
	"github.com/corral-dev/corral/internal/storage/blob"
	"github.com/corral-dev/corral/internal/storage/layers"
	"github.com/corral-dev/corral/internal/storage/lazy"
)

// LazyOptions configure Lazy. Zero fields take the defaults.
type LazyOptions struct {
	// Rootfs is the tree to serve; "" builds (once, then reuses) the
	// debian image (python3 included) in ImageDir.
	Rootfs   string
	ImageDir string // default /var/tmp/corral-bench-lazy/images
	WorkDir  string // parent of the run's temp dir (default /var/tmp)
	// ChunkSizes are measured for the cold start; ChunkSize is used for the
	// burst and warm phases (default blob.DefaultChunkSize).
	ChunkSizes []int64
	ChunkSize  int64
	// The modelled link to the shared store (default 50 MiB/s, 10 ms).
	BytesPerSec int64
	Latency     time.Duration
	Starts      int // burst size (default 64)
	WarmN       int // warm-start samples per side (default 10)
	Command     []string
	Log         io.Writer
}

func (o *LazyOptions) defaults() {
	ifZero(&o.ImageDir, "/var/tmp/corral-bench-lazy/images")
	ifZero(&o.WorkDir, "/var/tmp")
	if len(o.ChunkSizes) == 0 {
		o.ChunkSizes = []int64{256 << 10, 512 << 10, 1 << 20, 4 << 20}
	}
	ifZero(&o.ChunkSize, blob.DefaultChunkSize)
	ifZero(&o.BytesPerSec, 50<<20)
	ifZero(&o.Latency, 10*time.Millisecond)
	ifNotPositive(&o.Starts, 64)
	ifNotPositive(&o.WarmN, 20)
	if len(o.Command) == 0 {
		o.Command = []string{"/usr/bin/python3", "-c", "import json, sqlite3"}
	}
	ifZero(&o.Log, io.Discard)
}

// ChunkRun is one cold start with one fetch chunk size.
type ChunkRun struct {
	ChunkSize       int64   `json:"chunk_size"`
	ColdStartMs     float64 `json:"cold_start_ms"` // mount + command, empty cache
	BytesFetched    int64   `json:"bytes_fetched"`
	FetchedFraction float64 `json:"fetched_fraction"` // of the data blob
	Chunks          int     `json:"chunks_fetched"`
}

// LazyResult is the outcome of Lazy.
type LazyResult struct {
	Command     string  `json:"command"`
	BlobBytes   int64   `json:"blob_bytes"` // the layer's data blob
	MetaBytes   int64   `json:"meta_bytes"` // its EROFS metadata, always local
	BytesPerSec int64   `json:"link_bytes_per_s"`
	LatencyMs   float64 `json:"link_latency_ms"`
	ChunkSize   int64   `json:"chunk_size"`

	ChunkRuns       []ChunkRun `json:"chunk_runs"`
	FetchedFraction float64    `json:"fetched_fraction"` // at ChunkSize

	Starts            int     `json:"starts"`
	BurstLazyS        float64 `json:"burst_lazy_s"`        // the start hint replayed as a prefetch
	BurstLazyNoHintS  float64 `json:"burst_lazy_nohint_s"` // no hint: every chunk on demand
	BurstEagerS       float64 `json:"burst_eager_s"`
	BurstSpeedup      float64 `json:"burst_speedup"` // eager / lazy
	LazyWrittenBytes  int64   `json:"lazy_written_bytes"`
	EagerWrittenBytes int64   `json:"eager_written_bytes"`
	DiskWriteRatio    float64 `json:"disk_write_ratio"` // eager / lazy
	BurstHitRate      float64 `json:"burst_hit_rate"`

	// Warm cache, the layer mounted afresh for each start (every read
	// goes through the lazy blob file), against the blob fully local.
	WarmStart   Percentiles `json:"warm_start"`
	LocalStart  Percentiles `json:"local_start"`
	WarmStartMs float64     `json:"warm_start_ms"`
	LocalMs     float64     `json:"local_start_ms"`
	WarmRatio   float64     `json:"warm_ratio"` // warm / local
	// The same with the layer mounted once and shared by the starts, as
	// a node does: EROFS's page cache serves repeat reads on both sides.
	WarmShared      Percentiles `json:"warm_shared"`
	LocalShared     Percentiles `json:"local_shared"`
	WarmSharedRatio float64     `json:"warm_shared_ratio"`
	WarmFuseReads   int64       `json:"warm_fuse_reads"` // lazy file reads per fresh-mount warm start

	HintPrefetchStartMs float64  `json:"hint_prefetch_start_ms"` // cold cache, hint replayed first
	Targets             []Target `json:"targets"`
}

// Lazy measures lazy image loading on this host (it needs root, FUSE,
// EROFS and weed, and no server): the layer's blob is published to a real
// S3 store (SeaweedFS) reached through a modelled link, and each "start"
// mounts the layer's metadata with the blob file as its device and runs
// Command chrooted into it. Peers in the same run: the same starts after
// downloading the whole blob first (eager), and with the blob local.
func Lazy(ctx context.Context, o LazyOptions) (*LazyResult, error) {
	o.defaults()
	if os.Geteuid() != 0 {
		return nil, errors.New("bench lazy: needs root (mounts FUSE and EROFS)")
	}
	work, err := os.MkdirTemp(o.WorkDir, "corral-bench-lazy-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	tree := o.Rootfs
	if tree == "" {
		st, err := layers.Open(ctx, o.ImageDir)
		if err != nil {
			return nil, err
		}
		defer st.Close(true)
		fmt.Fprintf(o.Log, "image: debian in %s (built once with mmdebstrap)\n", o.ImageDir)
		img, err := st.Build(ctx, "debian", o.Log)
		if err != nil {
			return nil, err
		}
		if len(img.Layers) != 1 {
			return nil, fmt.Errorf("bench lazy: debian image has %d layers, want 1", len(img.Layers))
		}
		tree = img.Layers[0]
	}
	meta, blobPath := filepath.Join(work, "meta.erofs"), filepath.Join(work, "blob")
	fmt.Fprintf(o.Log, "mkfs.erofs --chunksize=4096 --blobdev of %s\n", tree)
	if out, err := exec.CommandContext(ctx, "mkfs.erofs", "--quiet", "-T0", "--chunksize=4096", "--blobdev="+blobPath, meta, tree).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mkfs.erofs: %w: %s", err, out)
	}
	r := &LazyResult{Command: strings.Join(o.Command, " "), BytesPerSec: o.BytesPerSec, LatencyMs: ms(o.Latency), ChunkSize: o.ChunkSize, Starts: o.Starts}
	r.BlobBytes, r.MetaBytes = fileSize(blobPath), fileSize(meta)

	fmt.Fprintln(o.Log, "starting SeaweedFS (weed server -s3)")
	srv, err := seaweed.Start(ctx, filepath.Join(work, "weed"), "corral-bench")
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	b := &lazyBench{o: o, work: work, meta: meta, blobPath: blobPath, link: &blob.Link{BytesPerSec: o.BytesPerSec, Latency: o.Latency}}
	sizes := append([]int64{}, o.ChunkSizes...)
	if !containsSize(sizes, o.ChunkSize) {
		sizes = append(sizes, o.ChunkSize)
	}
	stores := map[int64]blob.Store{}
	var digest string
	for _, cs := range sizes {
		// One prefix per chunk size: the manifest is keyed by the blob.
		s3, err := blob.NewS3(blob.S3Config{Endpoint: srv.Endpoint, Bucket: "corral-bench", Prefix: fmt.Sprintf("cs%d/", cs)})
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(o.Log, "publishing the %d MB blob with %d KiB chunks\n", r.BlobBytes>>20, cs>>10)
		m, err := blob.Publish(ctx, s3, blobPath, cs)
		if err != nil {
			return nil, err
		}
		digest = m.Blob
		stores[cs] = blob.Throttle(s3, b.link)
	}
	b.digest, b.size = digest, r.BlobBytes

	for _, cs := range o.ChunkSizes {
		run, err := b.cold(ctx, stores[cs], cs, false)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(o.Log, "cold start, %d KiB chunks: %.0f ms, fetched %.1f%%\n", cs>>10, run.ColdStartMs, 100*run.FetchedFraction)
		r.ChunkRuns = append(r.ChunkRuns, run)
	}
	main, err := b.cold(ctx, stores[o.ChunkSize], o.ChunkSize, true) // also records the hint
	if err != nil {
		return nil, err
	}
	r.FetchedFraction = main.FetchedFraction
	if r.HintPrefetchStartMs, err = b.hintStart(ctx, stores[o.ChunkSize]); err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Log, "cold start after replaying the hint: %.0f ms\n", r.HintPrefetchStartMs)
	if err := b.burst(ctx, stores[o.ChunkSize], r); err != nil {
		return nil, err
	}
	r.Targets = []Target{
		atMost("fetched_fraction", r.FetchedFraction, 0.15),
		atLeast("burst_speedup", r.BurstSpeedup, 1.7),
		atMost("warm_ratio", r.WarmRatio, 1.10),
	}
	return r, nil
}

type lazyBench struct {
	o              LazyOptions
	work           string
	meta, blobPath string
	digest         string
	size           int64
	link           *blob.Link
	seq            int
}

func (b *lazyBench) newFS(ctx context.Context, store blob.Store, cacheDir string) (*lazy.FS, error) {
	b.seq++
	return lazy.New(ctx, lazy.Config{
		Mountpoint: filepath.Join(b.work, fmt.Sprintf("fuse%d", b.seq)),
		CacheDir:   cacheDir,
	}, store)
}

// start mounts the layer with dev as its blob device, runs the command in
// it, and unmounts it again.
func (b *lazyBench) start(ctx context.Context, dev string) (time.Duration, error) {
	b.seq++
	dir := filepath.Join(b.work, fmt.Sprintf("layer%d", b.seq))
	t0 := time.Now()
	if err := mountLayer(b.meta, dev, dir); err != nil {
		return 0, err
	}
	defer unmountLayer(dir)
	if err := b.run(ctx, dir); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// run runs the command chrooted into root through the host's chroot
// binary: this process serves the FUSE mount, and a fork of it must never
// exec a file on that mount itself (the parent's forking thread holds its
// scheduler slot until the exec is done, so a fetch that needs a garbage
// collection would wait for it forever).
func (b *lazyBench) run(ctx context.Context, root string) error {
	cmd := exec.CommandContext(ctx, "chroot", append([]string{root}, b.o.Command...)...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s in %s: %w: %s", strings.Join(b.o.Command, " "), root, err, out)
	}
	return nil
}

// cold is one start from an empty cache with chunk size cs.
func (b *lazyBench) cold(ctx context.Context, store blob.Store, cs int64, recordHint bool) (ChunkRun, error) {
	cache := filepath.Join(b.work, fmt.Sprintf("cache-%d", cs))
	if recordHint {
		cache += "-hint"
	}
	f, err := b.newFS(ctx, store, cache)
	if err != nil {
		return ChunkRun{}, err
	}
	defer f.Close()
	t0 := time.Now()
	dev, err := f.Register(ctx, b.digest, b.size)
	if err != nil {
		return ChunkRun{}, err
	}
	var stop func() error
	if recordHint {
		if stop, err = f.Record(b.digest); err != nil {
			return ChunkRun{}, err
		}
	}
	if _, err := b.start(ctx, dev); err != nil {
		return ChunkRun{}, err
	}
	d := time.Since(t0) // register included
	if stop != nil {
		if err := stop(); err != nil {
			return ChunkRun{}, err
		}
	}
	st, err := f.Stats(b.digest)
	if err != nil {
		return ChunkRun{}, err
	}
	return ChunkRun{ChunkSize: cs, ColdStartMs: ms(d), BytesFetched: st.BytesFetched,
		FetchedFraction: round(float64(st.BytesFetched) / float64(b.size)), Chunks: st.ChunksPresent}, nil
}

// hintStart is a cold start on a cache that has only the recorded hint:
// the hint is prefetched first (as a node does when it places a sandbox).
func (b *lazyBench) hintStart(ctx context.Context, store blob.Store) (float64, error) {
	cache, err := b.hintedCache("cache-hinted")
	if err != nil {
		return 0, err
	}
	f, err := b.newFS(ctx, store, cache)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	t0 := time.Now()
	dev, err := f.Register(ctx, b.digest, b.size)
	if err != nil {
		return 0, err
	}
	f.StartPrefetch(b.digest, lazy.PrefetchHint)
	if _, err := b.start(ctx, dev); err != nil {
		return 0, err
	}
	return ms(time.Since(t0)), nil
}

// hintedCache makes an empty chunk cache dir that holds only the hint the
// cold start recorded (a node keeps hints per layer, apart from chunks).
func (b *lazyBench) hintedCache(name string) (string, error) {
	hex := strings.TrimPrefix(b.digest, "sha256:")
	cache := filepath.Join(b.work, name)
	if err := os.MkdirAll(cache, 0o700); err != nil {
		return "", err
	}
	raw, err := os.ReadFile(filepath.Join(b.work, fmt.Sprintf("cache-%d-hint", b.o.ChunkSize), hex+".hint"))
	if err != nil {
		return "", fmt.Errorf("hint: %w", err)
	}
	return cache, os.WriteFile(filepath.Join(cache, hex+".hint"), raw, 0o600)
}

// lazyBurst runs Starts commands at once on an empty chunk cache, with
// the hint replayed as a prefetch or without; it returns the FS (open, for
// the warm phase) and the blob file.
func (b *lazyBench) lazyBurst(ctx context.Context, store blob.Store, hint bool) (f *lazy.FS, dev string, secs float64, written int64, err error) {
	cache := filepath.Join(b.work, "cache-burst")
	if hint {
		if cache, err = b.hintedCache("cache-burst-hinted"); err != nil {
			return nil, "", 0, 0, err
		}
	}
	if f, err = b.newFS(ctx, store, cache); err != nil {
		return nil, "", 0, 0, err
	}
	w0 := writeBytes()
	t0 := time.Now()
	if dev, err = f.Register(ctx, b.digest, b.size); err == nil {
		if hint {
			f.StartPrefetch(b.digest, lazy.PrefetchHint)
		}
		err = b.many(ctx, dev)
	}
	if err != nil {
		f.Close()
		return nil, "", 0, 0, err
	}
	return f, dev, round(time.Since(t0).Seconds()), writeBytes() - w0, nil
}

// burst runs Starts commands at once from a cold cache, lazily (without
// and with the hint) and after an eager download, then the warm-start
// comparison.
func (b *lazyBench) burst(ctx context.Context, store blob.Store, r *LazyResult) error {
	f, _, secs, _, err := b.lazyBurst(ctx, store, false)
	if err != nil {
		return err
	}
	f.Close()
	r.BurstLazyNoHintS = secs
	fmt.Fprintf(b.o.Log, "burst of %d, lazy without a hint: %.2f s\n", b.o.Starts, secs)
	f, dev, secs, written, err := b.lazyBurst(ctx, store, true)
	if err != nil {
		return err
	}
	defer f.Close()
	r.BurstLazyS, r.LazyWrittenBytes = secs, written
	st, _ := f.Stats(b.digest)
	r.BurstHitRate = round(st.HitRate)
	fmt.Fprintf(b.o.Log, "burst of %d, lazy with the hint: %.2f s (fetched %d MB, wrote %d MB)\n", b.o.Starts, r.BurstLazyS, st.BytesFetched>>20, r.LazyWrittenBytes>>20)

	// Eager: the whole blob through the same link, checked, then started.
	local := filepath.Join(b.work, "eager-blob")
	w0 := writeBytes()
	t0 := time.Now()
	if err := download(ctx, store, b.digest, b.size, local); err != nil {
		return err
	}
	if err := b.many(ctx, local); err != nil {
		return err
	}
	r.BurstEagerS = round(time.Since(t0).Seconds())
	r.EagerWrittenBytes = writeBytes() - w0
	r.BurstSpeedup = round(r.BurstEagerS / r.BurstLazyS)
	if r.LazyWrittenBytes > 0 {
		r.DiskWriteRatio = round(float64(r.EagerWrittenBytes) / float64(r.LazyWrittenBytes))
	}
	fmt.Fprintf(b.o.Log, "burst of %d, eager: %.2f s (wrote %d MB)\n", b.o.Starts, r.BurstEagerS, r.EagerWrittenBytes>>20)

	// Warm: the lazy cache now holds what the command reads.
	var warm, loc []time.Duration
	before, _ := f.Stats(b.digest)
	for range b.o.WarmN {
		d, err := b.start(ctx, dev)
		if err != nil {
			return err
		}
		warm = append(warm, d)
		if d, err = b.start(ctx, local); err != nil {
			return err
		}
		loc = append(loc, d)
	}
	after, _ := f.Stats(b.digest)
	r.WarmFuseReads = (after.Hits + after.Misses - before.Hits - before.Misses) / int64(b.o.WarmN)
	r.WarmStart, r.LocalStart = Summarise(warm), Summarise(loc)
	r.WarmStartMs, r.LocalMs = r.WarmStart.P50, r.LocalStart.P50
	r.WarmRatio = round(r.WarmStartMs / r.LocalMs)
	fmt.Fprintf(b.o.Log, "warm start (fresh mount) p50 %.1f ms, local %.1f ms\n", r.WarmStartMs, r.LocalMs)
	if r.WarmShared, err = b.shared(ctx, dev); err != nil {
		return err
	}
	if r.LocalShared, err = b.shared(ctx, local); err != nil {
		return err
	}
	r.WarmSharedRatio = round(r.WarmShared.P50 / r.LocalShared.P50)
	fmt.Fprintf(b.o.Log, "warm start (shared mount) p50 %.1f ms, local %.1f ms\n", r.WarmShared.P50, r.LocalShared.P50)
	return nil
}

// shared mounts the layer once and times WarmN starts in it.
func (b *lazyBench) shared(ctx context.Context, dev string) (Percentiles, error) {
	b.seq++
	dir := filepath.Join(b.work, fmt.Sprintf("layer%d", b.seq))
	if err := mountLayer(b.meta, dev, dir); err != nil {
		return Percentiles{}, err
	}
	defer unmountLayer(dir)
	var ds []time.Duration
	for range b.o.WarmN + 1 {
		t0 := time.Now()
		if err := b.run(ctx, dir); err != nil {
			return Percentiles{}, err
		}
		ds = append(ds, time.Since(t0))
	}
	return Summarise(ds[1:]), nil // the first fills EROFS's page cache
}

// many mounts the layer once (a node mounts a layer once for all its
// sandboxes) and runs Starts commands in it at once.
func (b *lazyBench) many(ctx context.Context, dev string) error {
	b.seq++
	dir := filepath.Join(b.work, fmt.Sprintf("layer%d", b.seq))
	if err := mountLayer(b.meta, dev, dir); err != nil {
		return err
	}
	defer unmountLayer(dir)
	errs := make([]error, b.o.Starts)
	var wg sync.WaitGroup
	for i := range b.o.Starts {
		wg.Go(func() { errs[i] = b.run(ctx, dir) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// download copies the whole blob from store into path, checking its digest.
func download(ctx context.Context, store blob.Store, digest string, size int64, path string) error {
	rc, err := store.GetRange(ctx, digest, 0, size)
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, h), rc); err != nil {
		return fmt.Errorf("download %s: %w", digest, err)
	}
	if got := blob.Digest(h); got != digest {
		return fmt.Errorf("download %s: content hashes to %s", digest, got)
	}
	return f.Sync()
}

func mountLayer(meta, dev, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(meta, dir, "erofs", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, "device="+dev); err != nil {
		return fmt.Errorf("mount erofs %s (device=%s): %w", meta, dev, err)
	}
	return nil
}

func unmountLayer(dir string) {
	if err := unix.Unmount(dir, 0); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}
	os.Remove(dir)
}

// writeBytes is this process's write_bytes from /proc/self/io: what it
// caused to be written to storage (the FUSE server and the download both
// run here).
func writeBytes() int64 {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "write_bytes: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

func fileSize(p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return st.Size()
}

func containsSize(s []int64, v int64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// WriteTable prints the result.
func (r *LazyResult) WriteTable(w io.Writer) error {
	rows := []row{}
	for _, c := range r.ChunkRuns {
		rows = append(rows, row{fmt.Sprintf("cold start, %d KiB chunks", c.ChunkSize>>10),
			fmt.Sprintf("%s ms, fetched %s%% (%d chunks)", f3(c.ColdStartMs), f3(100*c.FetchedFraction), c.Chunks), "", ""})
	}
	rows = append(rows,
		row{"fetched_fraction", f3(r.FetchedFraction), fmt.Sprintf("of a %d MB blob; metadata %d MB local", r.BlobBytes>>20, r.MetaBytes>>20), targetFor(r.Targets, "fetched_fraction")},
		row{"cold start after hint prefetch", f3(r.HintPrefetchStartMs) + " ms", "", ""},
		row{fmt.Sprintf("burst of %d, lazy (hint replayed)", r.Starts), f3(r.BurstLazyS) + " s", fmt.Sprintf("eager (download first): %s s", f3(r.BurstEagerS)), ""},
		row{fmt.Sprintf("burst of %d, lazy without a hint", r.Starts), f3(r.BurstLazyNoHintS) + " s", fmt.Sprintf("%sx eager", f3(round(r.BurstEagerS/r.BurstLazyNoHintS))), ""},
		row{"burst_speedup", f3(r.BurstSpeedup) + "x", "", targetFor(r.Targets, "burst_speedup")},
		row{"disk_write_ratio", f3(r.DiskWriteRatio) + "x", fmt.Sprintf("eager wrote %d MB, lazy %d MB", r.EagerWrittenBytes>>20, r.LazyWrittenBytes>>20), ""},
		row{"warm_start_ms", fmt.Sprintf("p50 %s ms", f3(r.WarmStartMs)), fmt.Sprintf("blob local: p50 %s ms", f3(r.LocalMs)), ""},
		row{"warm_ratio", f3(r.WarmRatio) + "x", fmt.Sprintf("layer mounted per start; %d lazy-file reads each", r.WarmFuseReads), targetFor(r.Targets, "warm_ratio")},
		row{"warm start, shared mount", fmt.Sprintf("p50 %s ms", f3(r.WarmShared.P50)), fmt.Sprintf("blob local: p50 %s ms (%sx)", f3(r.LocalShared.P50), f3(r.WarmSharedRatio)), ""},
	)
	title := fmt.Sprintf("corral bench lazy: %q, store S3 (SeaweedFS) over a %d MiB/s, %s ms link, chunk %d KiB",
		r.Command, r.BytesPerSec>>20, f3(r.LatencyMs), r.ChunkSize>>10)
	return writeTable(w, title, rows)
}
