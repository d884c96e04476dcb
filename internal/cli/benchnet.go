package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/bench"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/netpolicy/netlab"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/server"
)

func newBenchNetCmd(g *globals) *cobra.Command {
	var o bench.NetOptions
	var keep bool
	cmd := benchCmd(g, "net", "Create→ready with an allowlist vs network none, and HTTP req/s from a sandbox vs from the host",
		`Measure what a network policy costs, on a private test network.

It runs a server of its own in this process (a temporary data dir, its own
cgroup parent and bridge) whose node side is a network namespace of its own,
linked to a test "internet" namespace on benchmark addresses (198.18.0.0/15)
serving HTTP: nothing on the host's interfaces, routes or forwarding settings
changes. Figures: create→ready p50 with an allowlist against network none
(interleaved), and HTTP requests/s from inside an allowlisted sandbox against
the same load generator (corral-probe httpload) run on the node side.
Must run as root; --addr is not used.`,
		func(ctx context.Context) (tabler, error) {
			if os.Geteuid() != 0 {
				return nil, fmt.Errorf("corral bench net must run as root (it runs a server and creates namespaces)")
			}
			if o.Probe == "" {
				exe, err := os.Executable()
				if err != nil {
					return nil, err
				}
				o.Probe = filepath.Join(filepath.Dir(exe), "corral-probe")
			}
			if _, err := os.Stat(o.Probe); err != nil {
				return nil, fmt.Errorf("--probe: %w (build it with make build)", err)
			}
			return runBenchNet(ctx, o, keep)
		})
	fl := cmd.Flags()
	fl.IntVar(&o.N, "n", 30, "creates per mode (allowlist, none)")
	fl.DurationVar(&o.Duration, "duration", 3*time.Second, "length of each load round")
	fl.IntVar(&o.Rounds, "rounds", 3, "load rounds per side (sandbox, host), alternating")
	fl.IntVar(&o.Concurrency, "concurrency", 8, "HTTP connections of the load")
	fl.StringVar(&o.Probe, "probe", "", "the static corral-probe (default: beside this binary)")
	fl.BoolVar(&keep, "keep-data", false, "keep the temporary data dir (debugging)")
	return cmd
}

// runBenchNet builds the test network and the server, runs the benchmark
// and removes both.
func runBenchNet(ctx context.Context, o bench.NetOptions, keep bool) (*bench.NetResult, error) {
	lab, err := netlab.New()
	if err != nil {
		return nil, err
	}
	defer lab.Close()
	dir, err := os.MkdirTemp("", "corral-bench-net-")
	if err != nil {
		return nil, err
	}
	if !keep {
		defer os.RemoveAll(dir)
	}
	rnd := make([]byte, 4)
	_, _ = rand.Read(rnd)
	suffix := hex.EncodeToString(rnd)
	cfg := server.Config{
		DataDir:       dir,
		CgroupParent:  "corral-bench-" + suffix,
		DiskPoolBytes: 8 << 30,
		CleanupOnExit: true,
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Network: netpolicy.Config{
			Bridge:    "cb-" + suffix,
			NodeNetns: lab.NodePath,
			Upstreams: []string{netip.AddrPortFrom(netlab.DNS4, 53).String()},
		},
	}
	srv, err := server.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := srv.Stop(sctx); err != nil {
			fmt.Fprintln(os.Stderr, "corral bench net: stop server:", err)
		}
	}()
	c, err := client.New("unix://" + filepath.Join(dir, "corral.sock"))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	o.URL = fmt.Sprintf("http://%s:%d/", netlab.PyPI4, netlab.HTTPPort)
	o.Allow = []string{fmt.Sprintf("%s:%d", netlab.PyPI4, netlab.HTTPPort)}
	o.Log = os.Stderr
	// The host peer runs in a cgroup of the same shape and CPU limit as
	// the sandbox's (a sibling under the same parent), so that the ratio
	// measures the network path, not the CPU scheduler's treatment of a
	// group against loose processes.
	cgm, err := cgroup.NewManager(cfg.CgroupParent)
	if err != nil {
		return nil, err
	}
	peer, err := cgm.Create("host-peer", cgroup.Limits{CPUMillis: int64(runtime.NumCPU()) * 1000})
	if peer != nil {
		defer peer.Remove(context.WithoutCancel(ctx))
	}
	if err != nil {
		return nil, err
	}
	o.HostRun = func(ctx context.Context, argv []string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Stderr = os.Stderr
		var out []byte
		// Started from a thread in the node namespace and the peer's
		// cgroups (the thread is thrown away afterwards).
		err := netpolicy.InNetns(lab.Node, func() error {
			if err := peer.EnterThread(); err != nil {
				return err
			}
			v2, err := peer.OpenV2()
			if err != nil {
				return err
			}
			if v2 != nil {
				defer v2.Close()
				cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(v2.Fd())}
			}
			out, err = cmd.Output()
			return err
		})
		return out, err
	}
	return bench.Net(ctx, c, o)
}
