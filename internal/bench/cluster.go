package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/cluster/simnode"
	"github.com/corral-dev/corral/internal/etcdembed"
	"github.com/corral-dev/corral/internal/server"
)

// ClusterOptions configures `corral bench cluster`.
type ClusterOptions struct {
	// SimulatedNodes behind the control plane (0 skips that part).
	SimulatedNodes int
	// Sandboxes is how many live sandboxes each placement mode creates.
	Sandboxes int
	// Concurrency is the creates in flight.
	Concurrency int
	// NodeLatency is the simulated nodes' modelled create time.
	NodeLatency time.Duration
	// RealNodes in-process cluster nodes with real sandboxes for the
	// create→ready overhead (0 skips it; needs root).
	RealNodes int
	// Samples of create→ready per path.
	Samples int
	// BasePort is the first of 8 TCP ports the run uses.
	BasePort int
	Log      io.Writer
}

// PlacementRun is one placement mode's figures.
type PlacementRun struct {
	Mode          string      `json:"mode"`
	K             int         `json:"k"`
	Creates       int         `json:"creates"`
	CreatesPerSec float64     `json:"creates_per_s"`
	Create        Percentiles `json:"create_latency"`
	Place         Percentiles `json:"placement_latency"`
	MaxPerNode    int         `json:"max_per_node"`
	MeanPerNode   float64     `json:"mean_per_node"`
	Balance       float64     `json:"balance_max_over_mean"`
	// CPUPerCreate is this process's CPU time (client, control plane,
	// etcd and the simulated nodes together) per create.
	CPUPerCreateMs float64 `json:"cpu_ms_per_create"`
	// ImpliedPerSec is the rate that CPU per create allows with every
	// core of the host to this process.
	ImpliedPerSec float64 `json:"implied_creates_per_s"`
	Failed        int     `json:"failed"`
	// Load is the host's, during this mode's creates.
	Load Load `json:"load"`
}

// ClusterResult is the benchmark's output.
type ClusterResult struct {
	Nodes      int            `json:"simulated_nodes"`
	Runs       []PlacementRun `json:"runs"`
	RealNodes  int            `json:"real_nodes"`
	ViaControl Percentiles    `json:"create_ready_via_control"`
	Direct     Percentiles    `json:"create_ready_direct"`
	OverheadMs float64        `json:"overhead_p50_ms"`
	RealLoad   Load           `json:"real_nodes_load"`
	// GetVia and GetDirect time a Get of one sandbox on node 0, through
	// the control plane and straight to the node, interleaved: one hop's
	// cost alone (no sandbox work, no audit), with far less spread than
	// create→ready; HopMs is their p50 difference.
	GetVia    Percentiles `json:"get_via_control"`
	GetDirect Percentiles `json:"get_direct"`
	HopMs     float64     `json:"hop_overhead_p50_ms"`
	Targets   []Target    `json:"targets"`
}

var benchSecret = cluster.Secret("corral-bench-cluster-secret")

// Cluster runs the cluster benchmark: a real etcd, simulated nodes and the
// real control plane (k=2, k=1 and a full scan in turn), then real nodes.
func Cluster(ctx context.Context, o ClusterOptions) (*ClusterResult, error) {
	ifZero(&o.Log, io.Discard)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir, err := os.MkdirTemp("", "corral-bench-cluster-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	e, err := etcdembed.StartCluster(ctx, filepath.Join(dir, "etcd"), 1, o.BasePort, false)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	res := &ClusterResult{Nodes: o.SimulatedNodes, RealNodes: o.RealNodes}
	if o.SimulatedNodes > 0 {
		if err := simulated(ctx, o, e.Endpoints(), quiet, res); err != nil {
			return nil, err
		}
	}
	if o.RealNodes > 0 {
		if err := realNodes(ctx, o, e.Endpoints(), dir, quiet, res); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func simulated(ctx context.Context, o ClusterOptions, eps []string, log *slog.Logger, res *ClusterResult) error {
	perNode := int64(2 * o.Sandboxes / o.SimulatedNodes)
	var specs []simnode.Spec
	for i := range o.SimulatedNodes {
		specs = append(specs, simnode.Spec{ID: simnode.NodeID(i), Latency: o.NodeLatency,
			Capacity: cluster.Capacity{Sandboxes: perNode}})
	}
	fmt.Fprintf(o.Log, "starting %d simulated nodes (capacity %d sandboxes each)\n", len(specs), perNode)
	fleet, err := simnode.Start(ctx, fmt.Sprintf("127.0.0.1:%d", o.BasePort+2), eps, benchSecret, specs, 10*time.Second, time.Second, log)
	if err != nil {
		return err
	}
	defer fleet.Close(context.WithoutCancel(ctx))
	for _, m := range []struct {
		name string
		k    int
	}{{"power-of-2", 2}, {"random (k=1)", 1}, {"full scan", 0}} {
		run, err := placementRun(ctx, o, eps, fleet, m.name, m.k, log)
		if err != nil {
			return err
		}
		fmt.Fprintf(o.Log, "%s: %.0f creates/s, balance %.3f\n", m.name, run.CreatesPerSec, run.Balance)
		res.Runs = append(res.Runs, run)
	}
	k2 := res.Runs[0]
	res.Targets = append(res.Targets,
		atLeast("creates_per_s", k2.CreatesPerSec, 5000),
		atMost("balance_max_over_mean", k2.Balance, 1.2))
	return nil
}

func placementRun(ctx context.Context, o ClusterOptions, eps []string, fleet *simnode.Fleet, name string, k int, log *slog.Logger) (PlacementRun, error) {
	for _, n := range fleet.Nodes() {
		if err := n.Reset(ctx); err != nil {
			return PlacementRun{}, fmt.Errorf("reset simulated node %s: %w", n.ID, err)
		}
	}
	var placeMu sync.Mutex
	var places []time.Duration
	// Through the socket: its caller is the cluster administrator.
	sock := filepath.Join(os.TempDir(), fmt.Sprintf("corral-bench-control-%d.sock", o.BasePort))
	ctl, err := server.StartControl(ctx, server.ControlConfig{Etcd: eps, Secret: benchSecret,
		Listen: fmt.Sprintf("127.0.0.1:%d", o.BasePort+3), Socket: sock, Placer: cluster.PlacerConfig{K: k}, Logger: log,
		OnPlace: func(d time.Duration) { placeMu.Lock(); places = append(places, d); placeMu.Unlock() }})
	if err != nil {
		return PlacementRun{}, err
	}
	defer ctl.Stop(context.WithoutCancel(ctx))
	// Start from reports that show the emptied nodes.
	time.Sleep(1500 * time.Millisecond)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = ctl.Watcher().WaitFor(wctx, func(s *cluster.Snapshot) bool { return len(s.Nodes) == len(fleet.Nodes()) })
	cancel()
	if err != nil {
		return PlacementRun{}, fmt.Errorf("control sees %d of %d nodes", len(ctl.Watcher().Snapshot().Nodes), len(fleet.Nodes()))
	}
	c, err := client.New("unix://"+sock, client.WithMaxConnections(o.Concurrency))
	if err != nil {
		return PlacementRun{}, err
	}
	defer c.Close()
	lat := make([][]time.Duration, o.Concurrency)
	var next, failed atomic.Int64
	var firstErr atomic.Value
	load := Load{Start: loadAvg(), CPUs: runtime.NumCPU()}
	start, cpu0 := time.Now(), processCPU()
	var wg sync.WaitGroup
	for w := range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(o.Sandboxes) && ctx.Err() == nil {
				t0 := time.Now()
				_, err := c.Create(ctx, client.CreateOptions{Resources: client.Resources{MemoryBytes: 64 << 20, CPUMillis: 100}})
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	wall, cpu := time.Since(start), processCPU()-cpu0
	load.End = loadAvg()
	if ctx.Err() != nil {
		return PlacementRun{}, ctx.Err()
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	run := PlacementRun{Mode: name, K: k, Creates: len(all), Failed: int(failed.Load()), Load: load,
		CreatesPerSec: round(float64(len(all)) / wall.Seconds()), Create: Summarise(all)}
	if len(all) > 0 {
		run.CPUPerCreateMs = ms(cpu / time.Duration(len(all)))
		if cpu > 0 {
			run.ImpliedPerSec = round(float64(load.CPUs) * float64(len(all)) / cpu.Seconds())
		}
	}
	placeMu.Lock()
	run.Place = Summarise(places)
	placeMu.Unlock()
	total := 0
	for _, n := range fleet.Nodes() {
		live := n.Live()
		total += live
		run.MaxPerNode = max(run.MaxPerNode, live)
	}
	run.MeanPerNode = round(float64(total) / float64(len(fleet.Nodes())))
	if run.MeanPerNode > 0 {
		run.Balance = round(float64(run.MaxPerNode) / run.MeanPerNode)
	}
	if e, ok := firstErr.Load().(string); ok {
		fmt.Fprintf(o.Log, "%s: %d creates failed, first: %s\n", name, run.Failed, e)
	}
	return run, nil
}

// realNodes measures create→ready (Create, then a first `true`) through
// the control plane against the same straight to a node's own socket.
func realNodes(ctx context.Context, o ClusterOptions, eps []string, dir string, log *slog.Logger, res *ClusterResult) error {
	var nodes []*server.ClusterNode
	defer func() {
		for _, n := range nodes {
			_ = n.Stop(context.WithoutCancel(ctx))
		}
	}()
	for i := range o.RealNodes {
		ndir := filepath.Join(dir, fmt.Sprintf("node%d", i))
		fmt.Fprintf(o.Log, "starting real node %d in %s\n", i, ndir)
		n, err := server.StartClusterNode(ctx, server.Config{
			DataDir: ndir, Listen: "", CgroupParent: fmt.Sprintf("corral-bench-cluster-%d-%d", o.BasePort, i),
			CleanupOnExit: true, Logger: log, DiskPoolBytes: 4 << 30,
		}, server.ClusterNodeConfig{Etcd: eps, Secret: benchSecret,
			Advertise: fmt.Sprintf("127.0.0.1:%d", o.BasePort+4+i), LeaseTTL: 10 * time.Second})
		if err != nil {
			return err
		}
		nodes = append(nodes, n)
	}
	sock := filepath.Join(dir, "control.sock")
	ctl, err := server.StartControl(ctx, server.ControlConfig{Etcd: eps, Secret: benchSecret,
		Listen: fmt.Sprintf("127.0.0.1:%d", o.BasePort+3), Socket: sock, Placer: cluster.PlacerConfig{K: 2}, Logger: log})
	if err != nil {
		return err
	}
	defer ctl.Stop(context.WithoutCancel(ctx))
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = ctl.Watcher().WaitFor(wctx, func(s *cluster.Snapshot) bool {
		ready := 0
		for _, v := range s.Nodes {
			if v.State == cluster.NodeReady && v.Version != "simulated" {
				ready++
			}
		}
		return ready == len(nodes)
	})
	cancel()
	if err != nil {
		return fmt.Errorf("control never saw the %d real nodes", len(nodes))
	}
	// The simulated nodes are gone: only real ones take placements.
	via, err := client.New("unix://" + sock)
	if err != nil {
		return err
	}
	defer via.Close()
	direct, err := client.New("unix://" + filepath.Join(dir, "node0", "corral.sock"))
	if err != nil {
		return err
	}
	defer direct.Close()
	var viaLat, dirLat []time.Duration
	res.RealLoad = Load{Start: loadAvg(), CPUs: runtime.NumCPU()}
	defer func() { res.RealLoad.End = loadAvg() }()
	sample := func(c *client.Client) (time.Duration, error) {
		t0 := time.Now()
		sb, err := c.Create(ctx, client.CreateOptions{Resources: client.Resources{MemoryBytes: 64 << 20}})
		if err != nil {
			return 0, err
		}
		_, err = sb.Run(ctx, client.Command{Args: []string{"true"}})
		d := time.Since(t0)
		_ = sb.Delete(context.WithoutCancel(ctx))
		return d, err
	}
	for i := range 2 * o.Samples {
		c, into := via, &viaLat
		if i%2 == 1 {
			c, into = direct, &dirLat
		}
		d, err := sample(c)
		if err != nil {
			return fmt.Errorf("create→ready sample %d: %w", i, err)
		}
		*into = append(*into, d)
	}
	res.ViaControl, res.Direct = Summarise(viaLat), Summarise(dirLat)
	sb, err := direct.Create(ctx, client.CreateOptions{Resources: client.Resources{MemoryBytes: 64 << 20}})
	if err != nil {
		return fmt.Errorf("sandbox for the Get samples: %w", err)
	}
	defer sb.Delete(context.WithoutCancel(ctx))
	var getVia, getDirect []time.Duration
	for i := range 20 * o.Samples {
		c, into := via, &getVia
		if i%2 == 1 {
			c, into = direct, &getDirect
		}
		t0 := time.Now()
		if _, err := c.Get(ctx, sb.ID()); err != nil {
			return fmt.Errorf("get sample %d: %w", i, err)
		}
		*into = append(*into, time.Since(t0))
	}
	res.GetVia, res.GetDirect = Summarise(getVia), Summarise(getDirect)
	res.HopMs = round(res.GetVia.P50 - res.GetDirect.P50)
	res.OverheadMs = round(res.ViaControl.P50 - res.Direct.P50)
	res.Targets = append(res.Targets, atMost("overhead_p50_ms", res.OverheadMs, 2))
	return nil
}

// WriteTable prints the result.
func (r *ClusterResult) WriteTable(w io.Writer) error {
	var rows []row
	for _, run := range r.Runs {
		rows = append(rows,
			row{run.Mode + " creates/s", f3(run.CreatesPerSec), fmt.Sprintf("%d creates, %d failed", run.Creates, run.Failed), targetIf(run.K == 2, r.Targets, "creates_per_s")},
			row{run.Mode + " CPU ms per create", f3(run.CPUPerCreateMs), fmt.Sprintf("this process: client, control plane, etcd, simulated nodes (%s/s with its %d cores to itself); %s", f3(run.ImpliedPerSec), run.Load.CPUs, run.Load), ""},
			row{run.Mode + " create p50/p99 ms", f3(run.Create.P50) + " / " + f3(run.Create.P99), "through the control plane", ""},
			row{run.Mode + " placement p50/p99 ms", f3(run.Place.P50) + " / " + f3(run.Place.P99), "the placement decision alone", ""},
			row{run.Mode + " balance max/mean", f3(run.Balance), fmt.Sprintf("max %d, mean %s per node", run.MaxPerNode, f3(run.MeanPerNode)), targetIf(run.K == 2, r.Targets, "balance_max_over_mean")},
		)
	}
	if r.RealNodes > 0 {
		rows = append(rows,
			row{"create→ready p50 via control ms", f3(r.ViaControl.P50), fmt.Sprintf("straight to the node: %s ms (p99 %s vs %s)", f3(r.Direct.P50), f3(r.ViaControl.P99), f3(r.Direct.P99)), ""},
			row{"one hop (Get) p50 via control ms", f3(r.GetVia.P50), fmt.Sprintf("straight to the node: %s ms; hop overhead %s ms (%d samples each)", f3(r.GetDirect.P50), f3(r.HopMs), r.GetVia.N), ""},
			row{"control plane overhead p50 ms", f3(r.OverheadMs), fmt.Sprintf("%d real nodes; %s", r.RealNodes, r.RealLoad), targetFor(r.Targets, "overhead_p50_ms")},
		)
	}
	return writeTable(w, fmt.Sprintf("corral bench cluster (%d simulated nodes, real etcd and control plane)", r.Nodes), rows)
}

// processCPU is this process's user+system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func targetIf(ok bool, ts []Target, figure string) string {
	if !ok {
		return ""
	}
	return targetFor(ts, figure)
}
