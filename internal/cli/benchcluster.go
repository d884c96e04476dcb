package cli

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/bench"
)

func newBenchClusterCmd(g *globals) *cobra.Command {
	o := bench.ClusterOptions{Log: os.Stderr}
	cmd := benchCmd(g, "cluster", "Control plane: creates/s, placement latency and balance over simulated nodes (power-of-2 vs random vs full scan), create→ready overhead with real nodes",
		`Runs its own cluster in this process (no server needed): a real etcd member,
--simulated-nodes node agents (the real node edge — admission, request-id
dedupe, load reports, leases — over an in-memory sandbox table with a
modelled create latency) behind the real control plane, driven through the
Go SDK. Each placement mode (power-of-2, k=1 random, full scan) creates
--sandboxes live sandboxes from empty nodes. Then --real-nodes in-process
nodes with real sandboxes (root): create→ready through the control plane
against straight to a node's socket, interleaved. TCP ports --base-port to
--base-port+7.`,
		func(ctx context.Context) (tabler, error) {
			if o.RealNodes > 0 && os.Geteuid() != 0 {
				return nil, fmt.Errorf("--real-nodes needs root (real sandboxes); use --real-nodes 0 to skip that part")
			}
			if o.SimulatedNodes < 0 || o.Sandboxes < 1 || o.Concurrency < 1 || o.RealNodes < 0 || o.RealNodes > 4 {
				return nil, fmt.Errorf("--simulated-nodes >= 0, --sandboxes >= 1, --concurrency >= 1, --real-nodes 0..4")
			}
			return bench.Cluster(ctx, o)
		})
	fl := cmd.Flags()
	fl.IntVar(&o.SimulatedNodes, "simulated-nodes", 160, "simulated nodes behind the control plane (0 skips that part)")
	fl.IntVar(&o.Sandboxes, "sandboxes", 100000, "live sandboxes each placement mode creates")
	fl.IntVar(&o.Concurrency, "concurrency", 128, "creates in flight")
	fl.DurationVar(&o.NodeLatency, "node-latency", time.Millisecond, "simulated create time on a node (uniform in [d/2, 3d/2])")
	fl.IntVar(&o.RealNodes, "real-nodes", 3, "in-process nodes with real sandboxes for the create→ready overhead (0 skips; root)")
	fl.IntVar(&o.Samples, "samples", 30, "create→ready samples per path")
	fl.IntVar(&o.BasePort, "base-port", 17580, "first of the 8 TCP ports the run listens on")
	return cmd
}
