package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/etcdembed"
	"github.com/corral-dev/corral/internal/server"
)

// clusterFlags are `corral serve`'s cluster flags.
type clusterFlags struct {
	role, secretFile, advertise, capMemory string
	tlsCert, tlsKey, tlsCA                 string
	etcd, labels                           []string
	capSandboxes, capCPU                   int64
	leaseTTL, report                       time.Duration
	k                                      int
	burst                                  float64
}

func (f *clusterFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&f.role, "role", "all", "all (API and node in this process, no etcd), node (a cluster node) or control (a cluster's stateless API)")
	fl.StringSliceVar(&f.etcd, "etcd", nil, "etcd client URLs of the cluster (--role node|control)")
	fl.StringVar(&f.secretFile, "cluster-secret-file", "", "file holding the cluster secret (at least 16 bytes) that signs control→node calls (--role node|control)")
	fl.StringVar(&f.tlsCert, "cluster-tls-cert", "", "PEM certificate for mutual TLS between control instances and nodes, beside or instead of the secret (with --cluster-tls-key, --cluster-ca; --role node|control)")
	fl.StringVar(&f.tlsKey, "cluster-tls-key", "", "PEM key of --cluster-tls-cert")
	fl.StringVar(&f.tlsCA, "cluster-ca", "", "PEM CA certificate that signs the other side's --cluster-tls-cert")
	fl.StringVar(&f.advertise, "advertise", "", "host:port of the node's cluster listener, on the node network (--role node)")
	fl.StringArrayVar(&f.labels, "node-label", nil, "a node label KEY=VALUE for placement, e.g. gpu=true, pool=burst (repeatable; --role node)")
	fl.Int64Var(&f.capSandboxes, "capacity-sandboxes", 0, "most sandboxes the node admits (default 3200; --role node)")
	fl.Int64Var(&f.capCPU, "capacity-cpu-millis", 0, "most CPU millicores the node commits (0: no limit; --role node)")
	fl.StringVar(&f.capMemory, "capacity-memory", "", "most memory the node commits (default the host's; --role node)")
	fl.DurationVar(&f.leaseTTL, "lease-ttl", 10*time.Second, "a node that stops renewing is lost this long after (--role node)")
	fl.DurationVar(&f.report, "report-interval", time.Second, "how often the node reports its load (--role node)")
	fl.IntVar(&f.k, "placement-k", 2, "nodes sampled per placement, the least loaded taken; 0 scans all (--role control)")
	fl.Float64Var(&f.burst, "burst-threshold", 0.8, "primary pool utilisation above which burst-ok creates may use pool=burst nodes (--role control)")
}

// auth is how control→node calls are authenticated: the secret, mutual
// TLS, or both; at least one is required.
func (f *clusterFlags) auth() (cluster.Secret, *cluster.TLS, error) {
	var t *cluster.TLS
	if f.tlsCert != "" || f.tlsKey != "" || f.tlsCA != "" {
		if f.tlsCert == "" || f.tlsKey == "" || f.tlsCA == "" {
			return nil, nil, fmt.Errorf("--cluster-tls-cert, --cluster-tls-key and --cluster-ca: give all three for mutual TLS")
		}
		var err error
		if t, err = cluster.LoadTLS(f.tlsCert, f.tlsKey, f.tlsCA); err != nil {
			return nil, nil, err
		}
	}
	if f.secretFile == "" {
		if t == nil {
			return nil, nil, fmt.Errorf("--cluster-secret-file (or --cluster-tls-cert, --cluster-tls-key, --cluster-ca): required with --role %s", f.role)
		}
		return nil, t, nil
	}
	sec, err := cluster.LoadSecret(f.secretFile)
	return sec, t, err
}

func (f *clusterFlags) nodeConfig() (server.ClusterNodeConfig, error) {
	sec, tlsc, err := f.auth()
	if err != nil {
		return server.ClusterNodeConfig{}, err
	}
	labels := map[string]string{}
	for _, l := range f.labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return server.ClusterNodeConfig{}, fmt.Errorf("--node-label %q: want KEY=VALUE", l)
		}
		labels[k] = v
	}
	mem, err := parseBytes("capacity-memory", f.capMemory)
	if err != nil {
		return server.ClusterNodeConfig{}, err
	}
	return server.ClusterNodeConfig{
		Etcd: f.etcd, Secret: sec, TLS: tlsc, Advertise: f.advertise, Labels: labels,
		Capacity: cluster.Capacity{Sandboxes: f.capSandboxes, CPUMillis: f.capCPU, MemoryBytes: mem},
		LeaseTTL: f.leaseTTL, ReportInterval: f.report,
	}, nil
}

// runControl serves a control instance until ctx ends.
func (f *clusterFlags) runControl(ctx context.Context, listen, socket string, log *slog.Logger) error {
	sec, tlsc, err := f.auth()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := server.StartControl(ctx, server.ControlConfig{
		Etcd: f.etcd, Secret: sec, TLS: tlsc, Listen: listen, Socket: socket, Logger: log,
		Placer: cluster.PlacerConfig{K: f.k, BurstThreshold: f.burst},
	})
	if err != nil {
		return err
	}
	werr := c.Wait(ctx)
	return joinErr(werr, c.Stop(context.Background()))
}

// serving is what `corral serve` runs: a server, or a cluster node.
type serving interface {
	Wait(ctx context.Context) error
	Stop(ctx context.Context) error
}

func (f *clusterFlags) start(ctx context.Context, cfg server.Config) (serving, error) {
	switch f.role {
	case "all", "":
		return server.Start(ctx, cfg)
	case "node":
		nc, err := f.nodeConfig()
		if err != nil {
			return nil, err
		}
		return server.StartClusterNode(ctx, cfg, nc)
	}
	return nil, fmt.Errorf("--role %q: want all, node or control", f.role)
}

func newEtcdCmd() *cobra.Command {
	var c etcdembed.Config
	var nofsync bool
	cmd := &cobra.Command{
		Use:    "etcd",
		Short:  "Run one member of an etcd cluster (the real etcd, embedded), for one-machine clusters",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c.NoFsync = nofsync
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			m, err := etcdembed.Start(ctx, c)
			if err != nil {
				return err
			}
			defer m.Close()
			fmt.Fprintln(os.Stderr, "etcd member", c.Name, "serving", c.ClientURL)
			select {
			case <-ctx.Done():
				return nil
			case err := <-m.Err():
				return err
			}
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&c.Name, "name", "m0", "member name")
	fl.StringVar(&c.DataDir, "data-dir", "", "member data directory")
	fl.StringVar(&c.ClientURL, "client-url", "http://127.0.0.1:2379", "client URL to listen on")
	fl.StringVar(&c.PeerURL, "peer-url", "http://127.0.0.1:2380", "peer URL to listen on")
	fl.StringVar(&c.InitialCluster, "initial-cluster", "", "name=peerURL,... of the founding members (default: this one alone)")
	fl.BoolVar(&nofsync, "no-fsync", false, "skip fsync (tests only)")
	return cmd
}
