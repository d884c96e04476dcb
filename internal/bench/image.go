package bench

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/client"
)

// ImageOptions configure Image. Zero fields take the defaults. The
// benchmark writes its layer sources under TmpDir and asks the server to
// build layers from there: run it on the server's machine.
type ImageOptions struct {
	N           int // sandboxes per start peer (default 20)
	Concurrency int // default 4
	// The workspace and toolkit layers: files and total bytes (defaults
	// 2,000 files / 64 MiB and 200 files / 8 MiB).
	WorkspaceFiles, ToolkitFiles int
	WorkspaceBytes, ToolkitBytes int64
	// Compositions are the counts of compositions referencing the toolkit
	// for upgrade_ms (default 1, 100, 1000).
	Compositions []int
	// The pack workload (default 10,000 files / 100 MiB).
	PackFiles int
	PackBytes int64
	TmpDir    string    // default os.TempDir()
	Log       io.Writer // progress lines; nil discards
}

func (o *ImageOptions) defaults() {
	ifNotPositive(&o.N, 20)
	ifNotPositive(&o.Concurrency, 4)
	ifNotPositive(&o.WorkspaceFiles, 2000)
	ifNotPositive(&o.ToolkitFiles, 200)
	ifNotPositive(&o.PackFiles, 10000)
	ifNotPositive(&o.WorkspaceBytes, 64<<20)
	ifNotPositive(&o.ToolkitBytes, 8<<20)
	ifNotPositive(&o.PackBytes, 100<<20)
	if len(o.Compositions) == 0 {
		o.Compositions = []int{1, 100, 1000}
	}
	slices.Sort(o.Compositions)
	ifZero(&o.TmpDir, os.TempDir())
	ifZero(&o.Log, io.Discard)
}

// StartPeer is one way of starting N sandboxes with the stack's content.
type StartPeer struct {
	// WallMs is the time to have all N ready (Concurrency at a time).
	WallMs float64 `json:"wall_ms"`
	// PerSandbox is create → content readable, per sandbox.
	PerSandbox Percentiles `json:"per_sandbox"`
	// BytesWritten are bytes written to disk: the sandboxes' writable
	// layers (filesystem usage above a fresh sandbox's), plus, for EROFS,
	// the layer files built once.
	BytesWritten int64 `json:"bytes_written"`
}

// UpgradeRow is upgrade_ms at one composition count.
type UpgradeRow struct {
	Compositions int `json:"compositions"`
	// UpgradeMs publishes a new toolkit version that every composition
	// follows by name.
	UpgradeMs float64 `json:"upgrade_ms"`
	// RepinMs is the peer: recording one composition per image pinned to
	// the new version (what pinned references cost per upgrade).
	RepinMs float64 `json:"repin_ms"`
	// Verified: a sandbox from the last composition saw the new version.
	Verified bool `json:"verified"`
}

// ImageResult is the outcome of Image.
type ImageResult struct {
	N              int     `json:"n"`
	Concurrency    int     `json:"concurrency"`
	StackFiles     int     `json:"stack_files"`
	StackBytes     int64   `json:"stack_bytes"`
	LayerBuildMs   float64 `json:"layer_build_ms"`
	LayerFileBytes int64   `json:"layer_file_bytes"`

	Erofs StartPeer `json:"erofs"`
	Tar   StartPeer `json:"tar"`
	// ErofsStartMs and TarStartMs are the two wall times; StartRatio is
	// tar / erofs (above 1: mounting is faster), WritesRatio likewise for
	// bytes written.
	ErofsStartMs float64 `json:"erofs_start_ms"`
	TarStartMs   float64 `json:"tar_start_ms"`
	StartRatio   float64 `json:"start_ratio"`
	WritesRatio  float64 `json:"writes_ratio"`

	Upgrade []UpgradeRow `json:"upgrade"`
	// UpgradeGrowth is upgrade_ms at the largest count over the smallest.
	UpgradeGrowth float64 `json:"upgrade_growth"`

	PackFiles int     `json:"pack_files"`
	PackBytes int64   `json:"pack_bytes"`
	PackMs    float64 `json:"pack_ms"`
	// PackTarMs is the peer: tar of the same files inside the sandbox.
	PackTarMs          float64 `json:"pack_tar_ms"`
	PackRatio          float64 `json:"pack_ratio"`
	PackLayerBlobBytes int64   `json:"pack_layer_blob_bytes"`

	Leaked int  `json:"leaked"`
	Load   Load `json:"load"`
}

// Image measures layered images: starting sandboxes from a workspace +
// toolkit stack by mounting EROFS layers against extracting the same
// content as a tar into each sandbox; upgrading a toolkit referenced by
// 1..1000 compositions; and packing a sandbox's writes.
func Image(ctx context.Context, c *client.Client, o ImageOptions) (res *ImageResult, err error) {
	o.defaults()
	t := newTracker(c)
	res = &ImageResult{N: o.N, Concurrency: o.Concurrency, StackFiles: o.WorkspaceFiles + o.ToolkitFiles,
		StackBytes: o.WorkspaceBytes + o.ToolkitBytes, PackFiles: o.PackFiles, PackBytes: o.PackBytes}
	res.Load.Start, res.Load.CPUs = loadAvg(), runtime.NumCPU()
	tmp, err := os.MkdirTemp(o.TmpDir, "corral-bench-image-")
	if err != nil {
		return res, err
	}
	// The server builds layers from here as root: world-readable.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return res, err
	}
	refs := &imageRefs{c: c}
	defer func() {
		err = t.finish(ctx, &res.Load, &res.Leaked, err)
		err = errors.Join(err, refs.remove(ctx), os.RemoveAll(tmp))
	}()
	s := &imageBench{c: c, t: t, o: o, tmp: tmp, refs: refs, name: "bench-" + t.label}
	for _, step := range []func(context.Context, *ImageResult) error{s.layers, s.start, s.upgrade, s.pack} {
		if err := step(ctx, res); err != nil {
			return res, err
		}
	}
	res.StartRatio = ratio(res.TarStartMs, res.ErofsStartMs)
	res.WritesRatio = ratio(float64(res.Tar.BytesWritten), float64(res.Erofs.BytesWritten))
	res.PackRatio = ratio(res.PackMs, res.PackTarMs)
	if n := len(res.Upgrade); n > 0 {
		res.UpgradeGrowth = ratio(res.Upgrade[n-1].UpgradeMs, res.Upgrade[0].UpgradeMs)
	}
	return res, nil
}

type imageBench struct {
	c    *client.Client
	t    *tracker
	o    ImageOptions
	tmp  string
	refs *imageRefs
	name string // prefix of every layer and composition of the run
	tool int    // the toolkit's current version
}

// imageRefs remembers what the run made, to remove it at the end:
// compositions first, then the layers they used.
type imageRefs struct {
	c                    *client.Client
	mu                   sync.Mutex
	compositions, layers []string
}

func (r *imageRefs) addComposition(ref string) {
	r.mu.Lock()
	r.compositions = append(r.compositions, ref)
	r.mu.Unlock()
}

func (r *imageRefs) addLayer(ref string) {
	r.mu.Lock()
	r.layers = append(r.layers, ref)
	r.mu.Unlock()
}

func (r *imageRefs) remove(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var errs []error
	for _, ref := range slices.Concat(r.compositions, r.layers) {
		if _, err := r.c.RemoveImage(ctx, ref); err != nil && !client.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// layers writes the workspace, toolkit and tar sources and builds them.
func (s *imageBench) layers(ctx context.Context, res *ImageResult) error {
	fmt.Fprintf(s.o.Log, "writing the stack: %d files, %d MiB\n", res.StackFiles, res.StackBytes>>20)
	ws, tool := filepath.Join(s.tmp, "ws"), filepath.Join(s.tmp, "tool")
	if err := writeTree(filepath.Join(ws, "bench/ws"), s.o.WorkspaceFiles, s.o.WorkspaceBytes, 1); err != nil {
		return err
	}
	if err := writeTree(filepath.Join(tool, "bench/tool"), s.o.ToolkitFiles, s.o.ToolkitBytes, 2); err != nil {
		return err
	}
	if err := s.setToolVersion(1); err != nil {
		return err
	}
	// The tar peer's source: the same two trees in one tar, itself in a
	// layer, so that extracting reads it from the page cache, not the API.
	tarDir := filepath.Join(s.tmp, "tarball")
	if err := writeTar(filepath.Join(tarDir, "bench.tar"), ws, tool); err != nil {
		return err
	}
	start := time.Now()
	for _, l := range []struct{ dir, ref string }{{ws, s.name + "-ws@1"}, {tool, s.name + "-tool@1"}} {
		layer, err := s.c.CreateLayer(ctx, l.dir, l.ref)
		if err != nil {
			return fmt.Errorf("build layer %s: %w", l.ref, err)
		}
		s.refs.addLayer(l.ref)
		res.LayerFileBytes += layer.MetaSize + layer.BlobSize
	}
	res.LayerBuildMs = ms(time.Since(start))
	if _, err := s.c.CreateLayer(ctx, tarDir, s.name+"-tar@1"); err != nil {
		return err
	}
	s.refs.addLayer(s.name + "-tar@1")
	for ref, layers := range map[string][]string{
		s.name + "-env@1":  {"busybox@1", s.name + "-ws@1", s.name + "-tool"},
		s.name + "-tarp@1": {"busybox@1", s.name + "-tar@1"},
	} {
		if _, err := s.c.CreateComposition(ctx, client.Composition{Ref: ref, Layers: layers}); err != nil {
			return err
		}
		s.refs.addComposition(ref)
	}
	return nil
}

func (s *imageBench) setToolVersion(v int) error {
	s.tool = v
	return os.WriteFile(filepath.Join(s.tmp, "tool/bench/tool/version"), []byte("v"+strconv.Itoa(v)+"\n"), 0o644)
}

// start runs both start peers and measures what each wrote.
func (s *imageBench) start(ctx context.Context, res *ImageResult) error {
	base, err := s.usedBytes(ctx, "busybox", "")
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	probe := lastFile("/bench/ws", s.o.WorkspaceFiles) + " " + lastFile("/bench/tool", s.o.ToolkitFiles) + " /bench/tool/version"
	peers := []struct {
		peer  *StartPeer
		image string
		ready string
	}{
		{&res.Erofs, s.name + "-env@1", "cat " + probe + " >/dev/null"},
		{&res.Tar, s.name + "-tarp@1", "tar -xf /bench.tar -C / && cat " + probe + " >/dev/null"},
	}
	for _, p := range peers {
		fmt.Fprintf(s.o.Log, "starting %d sandboxes from %s\n", s.o.N, p.image)
		var mu sync.Mutex
		var durs []time.Duration
		var used int64
		var errs []error
		wall := time.Now()
		parallel(ctx, s.o.N, s.o.Concurrency, func(ctx context.Context, i int) {
			begin := time.Now()
			sb, err := s.t.create(ctx, client.CreateOptions{Image: p.image, Resources: client.Resources{DiskBytes: 1 << 30}})
			if err == nil {
				err = sh(ctx, sb, p.ready)
			}
			d := time.Since(begin)
			var u int64
			if err == nil {
				u, err = dfUsed(ctx, sb)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			durs = append(durs, d)
			used += max(0, u-base)
		})
		p.peer.WallMs = ms(time.Since(wall))
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("start from %s: %w", p.image, err)
		}
		p.peer.PerSandbox = Summarise(durs)
		p.peer.BytesWritten = used
		if err := s.deleteAll(ctx); err != nil {
			return err
		}
	}
	res.Erofs.BytesWritten += res.LayerFileBytes
	res.ErofsStartMs, res.TarStartMs = res.Erofs.WallMs, res.Tar.WallMs
	return nil
}

// usedBytes is the writable layer usage of a fresh sandbox of image.
func (s *imageBench) usedBytes(ctx context.Context, image, script string) (int64, error) {
	sb, err := s.t.create(ctx, client.CreateOptions{Image: image, Resources: client.Resources{DiskBytes: 1 << 30}})
	if err != nil {
		return 0, err
	}
	defer s.t.delete(context.WithoutCancel(ctx), sb)
	if script != "" {
		if err := sh(ctx, sb, script); err != nil {
			return 0, err
		}
	}
	return dfUsed(ctx, sb)
}

func (s *imageBench) deleteAll(ctx context.Context) error {
	s.t.mu.Lock()
	ids := make([]string, 0, len(s.t.live))
	for id := range s.t.live {
		ids = append(ids, id)
	}
	s.t.mu.Unlock()
	return s.t.deleteAll(ctx, ids)
}

// upgrade publishes toolkit versions with 1..1000 compositions following it.
func (s *imageBench) upgrade(ctx context.Context, res *ImageResult) error {
	have := 0
	for _, k := range s.o.Compositions {
		fmt.Fprintf(s.o.Log, "upgrade with %d compositions\n", k)
		for ; have < k; have++ {
			ref := fmt.Sprintf("%s-c%d@1", s.name, have)
			if _, err := s.c.CreateComposition(ctx, client.Composition{Ref: ref,
				Layers: []string{"busybox@1", s.name + "-ws@1", s.name + "-tool"}}); err != nil {
				return err
			}
			s.refs.addComposition(ref)
		}
		if err := s.setToolVersion(s.tool + 1); err != nil {
			return err
		}
		toolRef := fmt.Sprintf("%s-tool@%d", s.name, s.tool)
		begin := time.Now()
		if _, err := s.c.CreateLayer(ctx, filepath.Join(s.tmp, "tool"), toolRef); err != nil {
			return err
		}
		row := UpgradeRow{Compositions: k, UpgradeMs: ms(time.Since(begin))}
		s.refs.addLayer(toolRef)
		begin = time.Now()
		for i := range k {
			ref := fmt.Sprintf("%s-pin%d-%d@1", s.name, s.tool, i)
			if _, err := s.c.CreateComposition(ctx, client.Composition{Ref: ref,
				Layers: []string{"busybox@1", s.name + "-ws@1", toolRef}}); err != nil {
				return err
			}
			s.refs.addComposition(ref)
		}
		row.RepinMs = ms(time.Since(begin))
		out, err := s.runIn(ctx, fmt.Sprintf("%s-c%d@1", s.name, k-1), "cat /bench/tool/version")
		if err != nil {
			return err
		}
		row.Verified = out == fmt.Sprintf("v%d\n", s.tool)
		res.Upgrade = append(res.Upgrade, row)
	}
	return nil
}

// runIn runs script in a new sandbox of image and returns its stdout.
func (s *imageBench) runIn(ctx context.Context, image, script string) (string, error) {
	sb, err := s.t.create(ctx, client.CreateOptions{Image: image})
	if err != nil {
		return "", err
	}
	defer s.t.delete(context.WithoutCancel(ctx), sb)
	r, err := sb.Run(ctx, client.Command{Shell: script})
	if err != nil {
		return "", err
	}
	if r.ExitCode != 0 {
		return "", fmt.Errorf("%q: exit %d: %s", script, r.ExitCode, r.Stderr)
	}
	return string(r.Stdout), nil
}

// pack changes PackBytes in PackFiles files in a sandbox and packs it.
func (s *imageBench) pack(ctx context.Context, res *ImageResult) error {
	fmt.Fprintf(s.o.Log, "pack: %d files, %d MiB\n", s.o.PackFiles, s.o.PackBytes>>20)
	src := filepath.Join(s.tmp, "packsrc")
	if err := writeTree(filepath.Join(src, "data"), s.o.PackFiles, s.o.PackBytes, 3); err != nil {
		return err
	}
	srcTar := filepath.Join(s.tmp, "packtar")
	if err := writeTar(filepath.Join(srcTar, "pack.tar"), src); err != nil {
		return err
	}
	if _, err := s.c.CreateLayer(ctx, srcTar, s.name+"-packsrc@1"); err != nil {
		return err
	}
	s.refs.addLayer(s.name + "-packsrc@1")
	if _, err := s.c.CreateComposition(ctx, client.Composition{Ref: s.name + "-packenv@1",
		Layers: []string{"busybox@1", s.name + "-packsrc@1"}}); err != nil {
		return err
	}
	s.refs.addComposition(s.name + "-packenv@1")
	sb, err := s.t.create(ctx, client.CreateOptions{Image: s.name + "-packenv@1", Resources: client.Resources{DiskBytes: 2 << 30}})
	if err != nil {
		return err
	}
	defer s.t.delete(context.WithoutCancel(ctx), sb)
	if err := sh(ctx, sb, "tar -xf /pack.tar -C / && rm /pack.tar 2>/dev/null; true"); err != nil {
		return err
	}
	begin := time.Now()
	if err := sh(ctx, sb, "tar -cf - /data | wc -c >/dev/null"); err != nil {
		return err
	}
	res.PackTarMs = ms(time.Since(begin))
	begin = time.Now()
	packed, err := sb.Pack(ctx, s.name+"-packed@1", client.PackOptions{})
	if err != nil {
		return err
	}
	res.PackMs = ms(time.Since(begin))
	s.refs.addComposition(s.name + "-packed@1")
	res.PackLayerBlobBytes = packed.Layer.BlobSize
	return nil
}

// sh runs a script and fails on a non-zero exit.
func sh(ctx context.Context, sb *client.Sandbox, script string) error {
	r, err := sb.Run(ctx, client.Command{Shell: script, Timeout: 10 * time.Minute})
	if err != nil {
		return err
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("sandbox %s: %q: exit %d: %s", sb.ID(), script, r.ExitCode, strings.TrimSpace(string(r.Stderr)))
	}
	return nil
}

// dfUsed is the used bytes of the sandbox's writable layer, as the
// overlay reports its upper filesystem.
func dfUsed(ctx context.Context, sb *client.Sandbox) (int64, error) {
	r, err := sb.Run(ctx, client.Command{Shell: "df -k / | tail -n 1"})
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(r.Stdout))
	if len(f) < 3 {
		return 0, fmt.Errorf("df: %q", r.Stdout)
	}
	kib, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("df: %q: %w", r.Stdout, err)
	}
	return kib << 10, nil
}

// writeTree writes files random files totalling bytes under dir, 100 to
// a directory.
func writeTree(dir string, files int, bytes int64, seed uint64) error {
	rng := rand.New(rand.NewChaCha8([32]byte{byte(seed)}))
	size := bytes / int64(files)
	buf := make([]byte, size)
	for i := range files {
		sub := filepath.Join(dir, "d"+strconv.Itoa(i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(sub, 0o755); err != nil {
				return err
			}
		}
		for j := 0; j < len(buf); j += 8 {
			v := rng.Uint64()
			for k := 0; k < 8 && j+k < len(buf); k++ {
				buf[j+k] = byte(v >> (8 * k))
			}
		}
		if err := os.WriteFile(filepath.Join(sub, "f"+strconv.Itoa(i)), buf, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// lastFile is the path of writeTree's last file under dir.
func lastFile(dir string, files int) string {
	return dir + "/d" + strconv.Itoa((files-1)/100) + "/f" + strconv.Itoa(files-1)
}

// writeTar writes the trees under roots into one tar file at dst.
func writeTar(dst string, roots ...string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || p == root {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			link := ""
			if d.Type()&fs.ModeSymlink != 0 {
				if link, err = os.Readlink(p); err != nil {
					return err
				}
			}
			h, err := tar.FileInfoHeader(info, link)
			if err != nil {
				return err
			}
			h.Name = p[len(root)+1:]
			if d.IsDir() {
				h.Name += "/"
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if !d.Type().IsRegular() {
				return nil
			}
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			_, err = io.Copy(tw, in)
			return err
		})
		if err != nil {
			f.Close()
			return err
		}
	}
	return errors.Join(tw.Close(), f.Close())
}

// WriteTable prints the result as a table.
func (r *ImageResult) WriteTable(w io.Writer) error {
	rows := []row{
		{"stack (workspace + toolkit)", fmt.Sprintf("%d files, %d MiB; layers built once in %s ms (%d MiB of layer files)",
			r.StackFiles, r.StackBytes>>20, f3(r.LayerBuildMs), r.LayerFileBytes>>20), "", ""},
		{"erofs_start_ms (N sandboxes, mount)", f3(r.ErofsStartMs), fmt.Sprintf("tar_start_ms (extract) %s; ratio %s×", f3(r.TarStartMs), f3(r.StartRatio)), ""},
		{"per sandbox p50 / p99 (mount)", f3(r.Erofs.PerSandbox.P50) + " / " + f3(r.Erofs.PerSandbox.P99) + " ms",
			"extract " + f3(r.Tar.PerSandbox.P50) + " / " + f3(r.Tar.PerSandbox.P99) + " ms", ""},
		{"bytes written (mount, layers included)", fmt.Sprintf("%.1f MiB", float64(r.Erofs.BytesWritten)/(1<<20)),
			fmt.Sprintf("extract %.1f MiB; ratio %s×", float64(r.Tar.BytesWritten)/(1<<20), f3(r.WritesRatio)), ""},
	}
	for _, u := range r.Upgrade {
		rows = append(rows, row{fmt.Sprintf("upgrade_ms (%d compositions)", u.Compositions), f3(u.UpgradeMs),
			fmt.Sprintf("repin %d pinned compositions %s ms; verified %v", u.Compositions, f3(u.RepinMs), u.Verified), ""})
	}
	rows = append(rows,
		row{"upgrade growth (largest / smallest count)", f3(r.UpgradeGrowth) + "×", "", ""},
		row{"pack_ms", f3(r.PackMs), fmt.Sprintf("%d files, %d MiB; tar of the same files in the sandbox %s ms (pack/tar %s×)",
			r.PackFiles, r.PackBytes>>20, f3(r.PackTarMs), f3(r.PackRatio)), ""},
		row{"leaked after delete", fmt.Sprint(r.Leaked), "", ""},
	)
	title := fmt.Sprintf("corral bench image: %d sandboxes per start peer, %d at a time", r.N, r.Concurrency)
	if err := writeTable(w, title, rows); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, r.Load)
	return err
}
