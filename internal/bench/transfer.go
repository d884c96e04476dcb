package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/corral-dev/corral/client"
)

// TransferOptions configure the transfer benchmark.
type TransferOptions struct {
	// Bytes is the size of the random tree (default 1 GiB).
	Bytes int64
	// Dir holds the trees on this machine (default the system temp dir).
	Dir   string
	Image string
	Log   io.Writer
}

// TransferResult is what `corral bench transfer` measured.
type TransferResult struct {
	Tree TreeStats `json:"tree"`
	// InMBps and OutMBps are content bytes per second through corral cp
	// (UploadDir, DownloadDir); TarMBps is the host's `tar -c | tar -x` of
	// the same tree in the same run (the mean of a run before and one
	// after corral's).
	InMBps   float64  `json:"in_mbps"`
	OutMBps  float64  `json:"out_mbps"`
	TarMBps  float64  `json:"tar_mbps"`
	InMs     float64  `json:"in_ms"`
	OutMs    float64  `json:"out_ms"`
	TarMs    float64  `json:"tar_ms"`
	Verified bool     `json:"verified"`
	Targets  []Target `json:"targets"`
	Leaked   int      `json:"leaked"`
	Load     Load     `json:"load"`
}

// Transfer copies a random tree into a sandbox and back out with the
// SDK's UploadDir/DownloadDir, checks the copy byte for byte and in
// metadata, and times the host's tar pipe of the same tree beside it.
func Transfer(ctx context.Context, c *client.Client, o TransferOptions) (res *TransferResult, err error) {
	if o.Bytes <= 0 {
		o.Bytes = 1 << 30
	}
	if o.Image == "" {
		o.Image = "busybox"
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	res = &TransferResult{}
	t := newTracker(c)
	defer func() { err = t.finish(ctx, &res.Load, &res.Leaked, err) }()
	res.Load.Start, res.Load.CPUs = loadAvg(), runtime.NumCPU()
	work, err := os.MkdirTemp(o.Dir, "corral-bench-transfer-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(work)
	src, peer, back := filepath.Join(work, "src"), filepath.Join(work, "peer"), filepath.Join(work, "back")
	fmt.Fprintf(o.Log, "writing a %d MiB tree in %s\n", o.Bytes>>20, src)
	if res.Tree, err = MakeTree(src, o.Bytes, 1); err != nil {
		return res, fmt.Errorf("make the tree: %w", err)
	}
	mb := float64(res.Tree.Bytes) / 1e6

	// The peer runs before and after corral's copies, and counts as their
	// mean: on a shared machine the load moves during a run.
	var peerTime time.Duration
	peerRun := func() error {
		fmt.Fprintln(o.Log, "host tar -c | tar -x")
		d, err := tarPipe(ctx, src, peer)
		peerTime += d / 2
		return errors.Join(err, os.RemoveAll(peer))
	}
	if err := peerRun(); err != nil {
		return res, err
	}

	life := time.Hour
	sb, err := t.create(ctx, client.CreateOptions{Image: o.Image, MaxLifetime: &life,
		Resources: client.Resources{DiskBytes: 2*res.Tree.Bytes + 512<<20}})
	if err != nil {
		return res, err
	}
	fmt.Fprintln(o.Log, "corral cp in")
	start := time.Now()
	if _, err := sb.Files().UploadDir(ctx, src, "/work/tree"); err != nil {
		return res, fmt.Errorf("upload: %w", err)
	}
	d := time.Since(start)
	res.InMs, res.InMBps = ms(d), round(mb/d.Seconds())
	fmt.Fprintln(o.Log, "corral cp out")
	start = time.Now()
	if err := sb.Files().DownloadDir(ctx, "/work/tree", back); err != nil {
		return res, fmt.Errorf("download: %w", err)
	}
	d = time.Since(start)
	res.OutMs, res.OutMBps = ms(d), round(mb/d.Seconds())
	if err := peerRun(); err != nil {
		return res, err
	}
	res.TarMs, res.TarMBps = ms(peerTime), round(mb/peerTime.Seconds())
	fmt.Fprintln(o.Log, "comparing")
	if err := CompareTrees(src, back); err != nil {
		return res, fmt.Errorf("the copy differs: %w", err)
	}
	res.Verified = true
	res.Targets = []Target{atLeast("in_mbps", res.InMBps, 200)}
	return res, t.delete(ctx, sb)
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

// WriteTable prints the result as a table.
func (r *TransferResult) WriteTable(w io.Writer) error {
	tree := fmt.Sprintf("%d files, %d dirs, %d symlinks, %d hard links, %d MiB", r.Tree.Files, r.Tree.Dirs,
		r.Tree.Symlinks, r.Tree.HardLinks, r.Tree.Bytes>>20)
	rows := []row{
		{"tree", tree, "", ""},
		{"in_mbps (corral cp DIR ID:/work/tree)", f3(r.InMBps), fmt.Sprintf("host tar -c | tar -x %s MB/s; ratio %s×", f3(r.TarMBps), f3(ratio(r.InMBps, r.TarMBps))), targetFor(r.Targets, "in_mbps")},
		{"out_mbps (corral cp ID:/work/tree DIR)", f3(r.OutMBps), fmt.Sprintf("host tar -c | tar -x %s MB/s; ratio %s×", f3(r.TarMBps), f3(ratio(r.OutMBps, r.TarMBps))), ""},
		{"in / out / tar ms", f3(r.InMs) + " / " + f3(r.OutMs) + " / " + f3(r.TarMs), "", ""},
		{"round trip identical (bytes, modes, owners, mtimes, links, xattrs)", fmt.Sprint(r.Verified), "", ""},
		{"leaked after delete", fmt.Sprint(r.Leaked), "", ""},
	}
	if err := writeTable(w, "corral bench transfer", rows); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, r.Load)
	return err
}
