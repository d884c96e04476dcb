package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/corral-dev/corral/client"
)

// TransferOptions configure the transfer benchmark.
type TransferOptions struct {
	// Bytes is the size of each random tree (default 1 GiB).
	Bytes int64
	// Shapes are the trees to copy, each in its own row (default mixed,
	// small, large; see TreeShape). The first mixed one gives the
	// top-level figures.
	Shapes []TreeShape
	// Dir holds the trees on this machine (default the system temp dir).
	Dir   string
	Image string
	Log   io.Writer
}

// TransferResult is what `corral bench transfer` measured: the figures of
// the mixed tree at the top, every shape's in Shapes.
type TransferResult struct {
	TransferRow
	Shapes  []TransferRow `json:"shapes"`
	Targets []Target      `json:"targets"`
	Leaked  int           `json:"leaked"`
	Load    Load          `json:"load"`
}

// TransferRow is one tree's copy in and out.
type TransferRow struct {
	Shape TreeShape `json:"shape"`
	Tree  TreeStats `json:"tree"`
	// InMBps and OutMBps are content bytes per second through corral cp
	// (UploadDir, DownloadDir); TarMBps is the host's `tar -c | tar -x` of
	// the same tree in the same run (the mean of a run before and one
	// after corral's).
	InMBps   float64 `json:"in_mbps"`
	OutMBps  float64 `json:"out_mbps"`
	TarMBps  float64 `json:"tar_mbps"`
	InMs     float64 `json:"in_ms"`
	OutMs    float64 `json:"out_ms"`
	TarMs    float64 `json:"tar_ms"`
	Verified bool    `json:"verified"`
}

// Transfer copies random trees into a sandbox and back out with the
// SDK's UploadDir/DownloadDir, checks each copy byte for byte and in
// metadata, and times the host's tar pipe of the same tree beside it.
func Transfer(ctx context.Context, c *client.Client, o TransferOptions) (res *TransferResult, err error) {
	ifNotPositive(&o.Bytes, 1<<30)
	if len(o.Shapes) == 0 {
		o.Shapes = []TreeShape{TreeMixed, TreeSmall, TreeLarge}
	}
	for _, s := range o.Shapes {
		if s != TreeMixed && s != TreeSmall && s != TreeLarge {
			return nil, fmt.Errorf("shapes: %q is none of mixed, small, large", s)
		}
	}
	ifZero(&o.Image, "busybox")
	ifZero(&o.Log, io.Discard)
	res = &TransferResult{}
	t := newTracker(c)
	defer func() { err = t.finish(ctx, &res.Load, &res.Leaked, err) }()
	res.Load.Start, res.Load.CPUs = loadAvg(), runtime.NumCPU()
	life := time.Hour
	sb, err := t.create(ctx, client.CreateOptions{Image: o.Image, MaxLifetime: &life,
		Resources: client.Resources{DiskBytes: 2*o.Bytes + 512<<20}})
	if err != nil {
		return res, err
	}
	for i, shape := range o.Shapes {
		row, err := transferTree(ctx, sb, o, shape, "/work/tree"+strconv.Itoa(i))
		if err != nil {
			return res, fmt.Errorf("%s tree: %w", shape, err)
		}
		res.Shapes = append(res.Shapes, row)
		if shape == TreeMixed && res.Shape == "" {
			res.TransferRow = row
			res.Targets = []Target{atLeast("in_mbps", row.InMBps, 200)}
		}
	}
	return res, t.delete(ctx, sb)
}

// transferTree writes a tree of shape, times its tar pipe, its copy into
// sb at dest and back out, compares the copy, and removes both.
func transferTree(ctx context.Context, sb *client.Sandbox, o TransferOptions, shape TreeShape, dest string) (row TransferRow, err error) {
	row.Shape = shape
	work, err := os.MkdirTemp(o.Dir, "corral-bench-transfer-")
	if err != nil {
		return row, err
	}
	defer os.RemoveAll(work)
	src, peer, back := filepath.Join(work, "src"), filepath.Join(work, "peer"), filepath.Join(work, "back")
	fmt.Fprintf(o.Log, "writing a %d MiB %s tree in %s\n", o.Bytes>>20, shape, src)
	if row.Tree, err = MakeShapedTree(src, o.Bytes, 1, shape); err != nil {
		return row, fmt.Errorf("make the tree: %w", err)
	}
	mb := float64(row.Tree.Bytes) / 1e6

	// The peer runs before and after corral's copies, and counts as their
	// mean: on a shared machine the load moves during a run. Nothing is
	// deleted until the end: creating files right after deleting many
	// makes ext4 skip the recently freed inodes one by one, which would
	// slow whichever copy came next.
	var peerTime time.Duration
	runs := 0
	peerRun := func() error {
		fmt.Fprintln(o.Log, "host tar -c | tar -x")
		runs++
		d, err := tarPipe(ctx, src, peer+strconv.Itoa(runs))
		peerTime += d / 2
		return err
	}
	if err := peerRun(); err != nil {
		return row, err
	}
	fmt.Fprintln(o.Log, "corral cp in")
	start := time.Now()
	if _, err := sb.Files().UploadDir(ctx, src, dest); err != nil {
		return row, fmt.Errorf("upload: %w", err)
	}
	d := time.Since(start)
	row.InMs, row.InMBps = ms(d), round(mb/d.Seconds())
	fmt.Fprintln(o.Log, "corral cp out")
	start = time.Now()
	if err := sb.Files().DownloadDir(ctx, dest, back); err != nil {
		return row, fmt.Errorf("download: %w", err)
	}
	d = time.Since(start)
	row.OutMs, row.OutMBps = ms(d), round(mb/d.Seconds())
	if err := peerRun(); err != nil {
		return row, err
	}
	row.TarMs, row.TarMBps = ms(peerTime), round(mb/peerTime.Seconds())
	fmt.Fprintln(o.Log, "comparing")
	if err := CompareTrees(src, back); err != nil {
		return row, fmt.Errorf("the copy differs: %w", err)
	}
	row.Verified = true
	if err := sb.Files().Remove(ctx, dest, true); err != nil {
		return row, fmt.Errorf("remove %s in the sandbox: %w", dest, err)
	}
	return row, nil
}

// tarPipe times the host's `tar -c -C src . | tar -x -C dst` with the
// metadata corral cp keeps.
func tarPipe(ctx context.Context, src, dst string) (time.Duration, error) {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return 0, err
	}
	c := exec.CommandContext(ctx, "tar", "-c", "--xattrs", "-C", src, ".")
	x := exec.CommandContext(ctx, "tar", "-x", "--xattrs", "--xattrs-include=user.*", "--numeric-owner", "--same-owner", "--same-permissions", "-C", dst)
	pipe, err := c.StdoutPipe()
	if err != nil {
		return 0, err
	}
	x.Stdin = pipe
	start := time.Now()
	if err := x.Start(); err != nil {
		return 0, err
	}
	if err := c.Run(); err != nil {
		_ = x.Wait()
		return 0, fmt.Errorf("tar -c: %w", err)
	}
	if err := x.Wait(); err != nil {
		return 0, fmt.Errorf("tar -x: %w", err)
	}
	return time.Since(start), nil
}

// WriteTable prints the result as a table: three rows a tree shape.
func (r *TransferResult) WriteTable(w io.Writer) error {
	var rows []row
	for _, t := range r.Shapes {
		tree := fmt.Sprintf("%d files, %d dirs, %d symlinks, %d hard links, %d MiB", t.Tree.Files, t.Tree.Dirs,
			t.Tree.Symlinks, t.Tree.HardLinks, t.Tree.Bytes>>20)
		target := ""
		if t.Shape == r.Shape {
			target = targetFor(r.Targets, "in_mbps")
		}
		peer := "host tar -c | tar -x " + f3(t.TarMBps) + " MB/s"
		rows = append(rows,
			row{string(t.Shape) + " tree", tree, "", ""},
			row{"  in_mbps (corral cp DIR ID:/work/tree)", f3(t.InMBps), fmt.Sprintf("%s; ratio %s×", peer, f3(ratio(t.InMBps, t.TarMBps))), target},
			row{"  out_mbps (corral cp ID:/work/tree DIR)", f3(t.OutMBps), fmt.Sprintf("%s; ratio %s×", peer, f3(ratio(t.OutMBps, t.TarMBps))), ""},
			row{"  in / out / tar ms", f3(t.InMs) + " / " + f3(t.OutMs) + " / " + f3(t.TarMs), "", ""},
			row{"  round trip identical (bytes, modes, owners, mtimes, links, xattrs)", fmt.Sprint(t.Verified), "", ""})
	}
	rows = append(rows, row{"leaked after delete", fmt.Sprint(r.Leaked), "", ""})
	if err := writeTable(w, "corral bench transfer", rows); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, r.Load)
	return err
}
