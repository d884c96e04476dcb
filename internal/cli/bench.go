package cli

import (
	"context"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/bench"
)

func newBenchCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure a running server against peers in the same run (runc, fork/exec, host memory)",
		Long: `Measure a running server, each figure beside a peer measured in the same run.

Benchmarks create sandboxes labelled corral-bench=<random> and delete them all
at the end, also on error or Ctrl-C. The density and runc figures read this
host (/proc/meminfo, runc), so run them on the server's machine.`,
	}
	cmd.AddCommand(newBenchContainerCmd(g), newBenchDensityCmd(g), newBenchSDKCmd(g), newBenchFnCallCmd(g), newBenchNetCmd(g), newBenchImageCmd(g), newBenchLazyCmd(g), newBenchMicroVMCmd(g), newBenchVMCmd(g), newBenchTransferCmd(g), newBenchE2BCmd(g), newBenchClusterCmd(g), newBenchPauseCmd(g))
	return cmd
}

func newBenchContainerCmd(g *globals) *cobra.Command {
	o := bench.ContainerOptions{Log: os.Stderr}
	cmd := serverBenchCmd(g, "container", "Create→ready, exec latency and create+exec+delete cycles/s, against runc and fork/exec", "",
		func(ctx context.Context, c *client.Client) (tabler, error) {
			return bench.Container(ctx, c, o)
		})
	fl := cmd.Flags()
	fl.IntVar(&o.N, "n", 50, "samples for create→ready and exec latency")
	fl.IntVar(&o.Concurrency, "concurrency", 8, "workers for the cycle rates (corral and runc alike)")
	fl.DurationVar(&o.Duration, "duration", 20*time.Second, "length of each cycle-rate phase")
	fl.StringVar(&o.Image, "image", "busybox", "image to create sandboxes from")
	fl.StringVar(&o.Rootfs, "rootfs", "", "rootfs for the runc peer (default: a temporary busybox rootfs)")
	fl.StringVar(&o.TCPAddr, "tcp", "", "also compare create→ready over this TCP address with a project token (made on --addr, the unix socket) against the socket")
	return cmd
}

func newBenchDensityCmd(g *globals) *cobra.Command {
	o := bench.DensityOptions{Log: os.Stderr}
	cmd := serverBenchCmd(g, "density", "Host memory per idle sandbox for N sandboxes, and whether all of them answer", "",
		func(ctx context.Context, c *client.Client) (tabler, error) {
			return bench.Density(ctx, c, o)
		})
	fl := cmd.Flags()
	fl.IntVar(&o.N, "n", 100, "idle sandboxes to create")
	fl.IntVar(&o.Concurrency, "concurrency", 8, "creates, execs and deletes in flight")
	fl.StringVar(&o.Image, "image", "busybox", "image to create sandboxes from")
	sizeVar(cmd, &o.MemoryBytes, "memory", "64Mi", "memory limit of each sandbox")
	fl.BoolVar(&o.ExpectRefusals, "expect-refusals", false, "N is past what the node admits (e.g. --n 6000 with kernel.pid_max 32768 and serve --no-raise-limits): pass when the creates beyond are refused with resource exhausted and every admitted sandbox answers")
	return cmd
}

func newBenchSDKCmd(g *globals) *cobra.Command {
	o := bench.SDKOptions{Log: os.Stderr}
	cmd := serverBenchCmd(g, "sdk", "RL rollouts/s through the Go SDK and the Python SDK (python3 -m corral.bench) in the same run", "",
		func(ctx context.Context, c *client.Client) (tabler, error) {
			o.Addr = g.addr
			return bench.SDK(ctx, c, o)
		})
	fl := cmd.Flags()
	fl.IntSliceVar(&o.Concurrency, "concurrency", []int{64, 256}, "episodes in flight, one measurement each")
	fl.IntVar(&o.Episodes, "episodes", 0, "episodes per concurrency (default 2 x concurrency)")
	fl.StringVar(&o.Image, "image", "busybox", "image to create sandboxes from")
	fl.StringVar(&o.Python, "python", "python3", "interpreter for the Python SDK peer; empty skips it")
	fl.StringVar(&o.PythonPath, "python-path", "", "directory holding the corral package (default sdk/python here or beside bin/)")
	return cmd
}

func newBenchE2BCmd(g *globals) *cobra.Command {
	o := bench.E2BOptions{Log: os.Stderr}
	cmd := serverBenchCmd(g, "e2b", "create → commands.run('true') → kill through the unchanged e2b SDK (node), beside the same loop through the Go SDK", "",
		func(ctx context.Context, c *client.Client) (tabler, error) {
			return bench.E2B(ctx, c, o)
		})
	fl := cmd.Flags()
	fl.StringVar(&o.URL, "e2b-url", "", "the server's E2B API as http://HOST:PORT (its --e2b-listen)")
	fl.StringVar(&o.APIKey, "e2b-api-key", "", "the server's --e2b-api-key")
	fl.StringVar(&o.SDKDir, "sdk-dir", "", "directory with bench.mjs and the e2b npm package (default test/e2b)")
	fl.IntVar(&o.N, "n", 30, "sequential cycles per SDK for the latency")
	fl.IntVar(&o.Concurrency, "concurrency", 4, "cycles in flight for the rate (both SDKs alike)")
	fl.DurationVar(&o.Duration, "duration", 10*time.Second, "length of each rate phase")
	fl.StringVar(&o.Image, "image", "busybox", "image (E2B template) to create sandboxes from")
	return cmd
}

func newBenchFnCallCmd(g *globals) *cobra.Command {
	o := bench.FnCallOptions{Log: os.Stderr}
	cmd := serverBenchCmd(g, "fncall", "fncall calls/s (sh and python) and latency, against host fork+exec and runc run per call", "",
		func(ctx context.Context, c *client.Client) (tabler, error) {
			return bench.FnCall(ctx, c, o)
		})
	fl := cmd.Flags()
	fl.IntVar(&o.Concurrency, "concurrency", 8, "calls in flight (corral, fork+exec and runc alike)")
	fl.DurationVar(&o.Duration, "duration", 10*time.Second, "length of each rate phase")
	fl.StringVar(&o.ShImage, "image", "busybox", "image of the sh phase")
	fl.StringVar(&o.PyImage, "python-image", "debian", "image of the python phase (needs python3)")
	fl.StringVar(&o.Rootfs, "rootfs", "", "rootfs for the runc peer (default: a temporary busybox rootfs)")
	return cmd
}

func newBenchImageCmd(g *globals) *cobra.Command {
	o := bench.ImageOptions{Log: os.Stderr}
	cmd := serverBenchCmd(g, "image", "Start from EROFS layers vs extracting a tar, toolkit upgrade cost vs composition count, pack time",
		`Start N sandboxes from a workspace + toolkit stack by mounting its EROFS layers
(erofs_start_ms) and, in the same run, by extracting the same content as a tar
into each sandbox's writable layer (tar_start_ms), with the bytes each writes;
time a toolkit upgrade (a new layer version every composition follows) with
1, 100 and 1000 compositions, beside re-pinning that many compositions; and
time packing a sandbox that changed 100 MiB in 10,000 files, beside tar of the
same files. It builds its layers from files under --tmp-dir: run it on the
server's machine.`,
		func(ctx context.Context, c *client.Client) (tabler, error) {
			return bench.Image(ctx, c, o)
		})
	fl := cmd.Flags()
	fl.IntVar(&o.N, "n", 20, "sandboxes per start peer")
	fl.IntVar(&o.Concurrency, "concurrency", 4, "creates in flight (both peers alike)")
	fl.IntVar(&o.WorkspaceFiles, "workspace-files", 2000, "files in the workspace layer")
	sizeVar(cmd, &o.WorkspaceBytes, "workspace-size", "64Mi", "bytes in the workspace layer")
	fl.IntVar(&o.ToolkitFiles, "toolkit-files", 200, "files in the toolkit layer")
	sizeVar(cmd, &o.ToolkitBytes, "toolkit-size", "8Mi", "bytes in the toolkit layer")
	fl.IntSliceVar(&o.Compositions, "compositions", []int{1, 100, 1000}, "composition counts for upgrade_ms")
	fl.IntVar(&o.PackFiles, "pack-files", 10000, "files the packed sandbox changed")
	sizeVar(cmd, &o.PackBytes, "pack-size", "100Mi", "bytes the packed sandbox changed")
	fl.StringVar(&o.TmpDir, "tmp-dir", "", "where to write the layer sources (default the system's temp dir)")
	return cmd
}

func newBenchMicroVMCmd(g *globals) *cobra.Command {
	o := bench.MicroVMOptions{Log: os.Stderr}
	cmd := serverBenchCmd(g, "microvm", "MicroVM boot→ready, exec latency, host memory per idle VM and resume from a snapshot, beside containers",
		`Measures the microvm backend beside container sandboxes of the same run:
create→first exec (boot_ready), exec of true, host memory of idle VMs (VMM RSS plus
the files in their run dirs, and the fall in MemAvailable), and resume of a VM paused
to a memory snapshot. The snapshot is taken when the server's
--microvm-snapshot-after says (start it with 0 to snapshot at pause). Run it on the
server's machine: the VMM processes are read from /proc.`,
		func(ctx context.Context, c *client.Client) (tabler, error) {
			return bench.MicroVM(ctx, c, o)
		})
	fl := cmd.Flags()
	fl.IntVar(&o.Boots, "boots", 5, "create→first exec samples per backend")
	fl.IntVar(&o.Execs, "execs", 30, "exec samples per backend")
	fl.IntVar(&o.Idle, "idle", 20, "idle sandboxes per backend for the memory figures")
	fl.StringVar(&o.Image, "image", "busybox", "image to create sandboxes from")
	sizeVar(cmd, &o.MemoryBytes, "memory", "256Mi", "guest RAM of each microVM (and memory limit of each container)")
	fl.DurationVar(&o.SnapshotMax, "snapshot-wait", 3*time.Minute, "longest wait for a paused VM's memory snapshot")
	return cmd
}

func newBenchTransferCmd(g *globals) *cobra.Command {
	o := bench.TransferOptions{Log: os.Stderr}
	var shapes []string
	cmd := serverBenchCmd(g, "transfer", "corral cp of a random tree into a sandbox and back (MB/s), beside the host's tar -c | tar -x of the same tree",
		`Writes a random tree (half in a few big files, half in small ones, with
symlinks, hard links, modes, owners, mtimes and xattrs; then one of small files
only and one of 4 big files, a row each) on this machine, copies
it into a sandbox and back out with the SDK's UploadDir/DownloadDir, checks the
copy byte for byte and in metadata, and times the host's tar pipe of the same
tree in the same run. Run it on the server's machine as root (owners).`,
		func(ctx context.Context, c *client.Client) (tabler, error) {
			o.Shapes = o.Shapes[:0]
			for _, s := range shapes {
				o.Shapes = append(o.Shapes, bench.TreeShape(s))
			}
			return bench.Transfer(ctx, c, o)
		})
	fl := cmd.Flags()
	sizeVar(cmd, &o.Bytes, "size", "1Gi", "size of each tree")
	fl.StringSliceVar(&shapes, "shapes", []string{"mixed", "small", "large"}, "trees to copy, a row each: mixed (half big files, half small), small (all in files of 0..16 KiB), large (4 big files)")
	fl.StringVar(&o.Dir, "dir", "", "where the trees are written (default the system temp dir)")
	fl.StringVar(&o.Image, "image", "busybox", "image of the sandbox")
	return cmd
}
