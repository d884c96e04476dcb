package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/node"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/storage/blob"
)

func newServeCmd() *cobra.Command {
	var cfg server.Config
	var nodeCgroup, nodeMemLow, layerWarm string
	var logLevel, logFormat, diskPool, defMemory, defDisk, subnet4, subnet6, presetsFile string
	var presets []string
	var swap, snapBytes string
	var d node.Defaults
	var bf blobFlags
	var e2bCfg server.E2BConfig
	var cf clusterFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the corral daemon (API + node) in this process",
		Long: `Run the corral daemon: the API and one node in one process, with local state.

Sandboxes survive a restart of the daemon: the next 'corral serve' on the same
--data-dir re-attaches to them and cleans up anything half-made. Must run as root.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			switch logFormat {
			case "text":
				cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			case "json":
				cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			default:
				return fmt.Errorf("--log-format: %q must be text or json", logFormat)
			}
			if cfg.InitStubServing <= 0 || cfg.InitStubServing > 1 {
				return fmt.Errorf("--init-stub-serving: %v must be above 0 and at most 1", cfg.InitStubServing)
			}
			if cf.role == "control" {
				return cf.runControl(cmd.Context(), cfg.Listen, cfg.Socket, cfg.Logger)
			}
			var err error
			if cfg.DiskPoolBytes, err = parseBytes("disk-pool", diskPool); err != nil {
				return err
			}
			if swap != "" {
				if cfg.SwapBytes, err = parseBytes("swap", swap); err != nil {
					return err
				}
			}
			switch snapBytes {
			case "none":
				cfg.Snapshots.Bytes = -1
			default:
				if cfg.Snapshots.Bytes, err = parseBytes("snapshot-bytes", snapBytes); err != nil {
					return err
				}
			}
			if cfg.Snapshots.Count == 0 {
				cfg.Snapshots.Count = -1 // --max-snapshots 0: no limit
			}
			if d.MemoryBytes, err = parseBytes("default-memory", defMemory); err != nil {
				return err
			}
			if d.DiskBytes, err = parseBytes("default-disk", defDisk); err != nil {
				return err
			}
			cfg.Defaults = d
			switch nodeCgroup {
			case "none":
			case "":
				// Beside the sandboxes' parent at the top of the hierarchy,
				// also when that parent is nested (a/b: a-b-node).
				cfg.NodeCgroup = strings.ReplaceAll(cfg.CgroupParent, "/", "-") + "-node"
			default:
				cfg.NodeCgroup = nodeCgroup
			}
			if cfg.NodeMemoryLow, err = parseBytes("node-memory-low", nodeMemLow); err != nil {
				return err
			}
			if cfg.LayerWarmBytes, err = parseBytes("layer-warm", layerWarm); err != nil {
				return err
			}
			if cfg.LayerWarmBytes == 0 {
				cfg.LayerWarmBytes = -1 // the flag's 0 is off; the Config's is the default
			}
			if err := netFlags(&cfg.Network, subnet4, subnet6, presetsFile, presets); err != nil {
				return err
			}
			if cfg.Blobs, err = bf.config(); err != nil {
				return err
			}
			if e2bCfg.Listen != "" {
				cfg.E2B = &e2bCfg
			}
			if os.Geteuid() != 0 {
				return fmt.Errorf("corral serve must run as root (it creates namespaces, mounts and cgroups)")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			srv, err := cf.start(ctx, cfg)
			if err != nil {
				return err
			}
			werr := srv.Wait(ctx)
			stopCtx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			return joinErr(werr, srv.Stop(stopCtx))
		},
	}
	fl := cmd.Flags()
	cf.add(fl)
	fl.StringVar(&cfg.DataDir, "data-dir", "/var/lib/corral", "state, images, writable layers and run files")
	fl.StringVar(&cfg.Socket, "socket", "", "unix socket for the API (default <data-dir>/corral.sock)")
	fl.StringVar(&cfg.Listen, "listen", "127.0.0.1:7070", "TCP address for the API (every call needs a token); empty disables it")
	fl.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate: serve the TCP listener over TLS (with --tls-key)")
	fl.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	fl.StringVar(&cfg.CgroupParent, "cgroup-parent", "corral", "cgroup under which sandboxes are created")
	fl.StringVar(&nodeCgroup, "node-cgroup", "", "the daemon's own cgroup, beside the sandboxes' parents, with a CPU weight 100x theirs and memory protection (default <cgroup-parent>-node; none: stay where started)")
	fl.StringVar(&nodeMemLow, "node-memory-low", "256Mi", "memory the kernel keeps for the node cgroup under host memory pressure (cgroup v2 memory.low; on v1 the sandboxes' parents are reclaimed first instead)")
	fl.BoolVar(&cfg.KeepCgroupMountOptions, "keep-cgroup-mount-options", false,
		"do not turn on the host's cgroup2 favordynmods option (which makes sandbox creation ~10 ms faster on cgroup v1 hosts)")
	fl.BoolVar(&cfg.RefusePageCacheProbes, "refuse-page-cache-probes", false,
		"refuse mincore, cachestat and RWF_NOWAIT reads in sandboxes, which show whether a neighbour read a shared layer file (see docs/THREATS.md)")
	fl.StringVar(&cfg.LayerMounts, "layer-mounts", server.LayerMountsShared, "shared (one mount of each layer for the node) or per-project (each project its own mounts: no page cache shared between projects; see docs/THREATS.md)")
	fl.StringVar(&layerWarm, "layer-warm", "128Mi", "how much of each newly mounted layer the node reads into the page cache (executables and libraries first), so that the first sandbox to run it is not charged for, and its memory limit cannot evict, the pages every sandbox of the image uses; 0: off (lazily loaded layers are never read)")
	fl.StringVar(&cfg.InitBinary, "init-binary", "", "path of corral-init (default: beside this binary)")
	fl.StringVar(&cfg.AgentBinary, "agent-binary", "", "path of the static corral-agent, init of microVM guests (default: beside this binary)")
	fl.DurationVar(&cfg.MicroVMSnapshotAfter, "microvm-snapshot-after", time.Minute,
		"how long a paused microVM (or vm sandbox without network) keeps its RAM before its memory and device state go to disk and its VMM exits (0: at pause; negative: never)")
	fl.StringVar(&cfg.DiskStore, "disk-store", server.DiskStoreAuto, "how sandbox disks are limited: auto (xfs when the kernel has XFS quota, else ext4-image), xfs or ext4-image")
	fl.StringVar(&swap, "swap", "", "size of a swap file the node makes under --data-dir (and removes at exit) for pause --reclaim, e.g. 4Gi; none when empty")
	fl.IntVar(&cfg.Snapshots.Count, "max-snapshots", node.DefaultMaxSnapshots, "most snapshots the node keeps (fork's count while it runs); one more is refused with resource exhausted before anything is written (0: no limit)")
	fl.StringVar(&snapBytes, "snapshot-bytes", "", "most bytes the node's snapshots take on disk, e.g. 200Gi (default half the filesystem of --data-dir; none: no limit)")
	fl.StringVar(&diskPool, "disk-pool", "64Gi", "size of the sparse XFS filesystem holding all writable layers (--disk-store xfs)")
	fl.BoolVar(&cfg.CleanupOnExit, "cleanup-on-exit", false, "delete every sandbox when the daemon exits")
	fl.BoolVar(&cfg.NoRaiseLimits, "no-raise-limits", false, "leave the host's limits as they are (by default the node raises kernel.pid_max to 4194304 and its own RLIMIT_NOFILE soft limit to the hard one)")
	fl.StringVar(&cfg.SandboxCACerts, "sandbox-ca-certs", "", "PEM file or directory of *.crt/*.pem: CA certificates every sandbox (container, fncall, microvm) trusts besides its image's (e.g. a TLS-intercepting proxy's); off by default")
	fl.StringVar(&cfg.ImportRoot, "import-root", "", "directory under which the node administrator (root on the unix socket) may name node paths in layer create --node-path and image import --node-path; default none: every node path is refused (clients stream their content)")
	fl.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&logFormat, "log-format", "text", "log lines as text (key=value) or json (one object a line)")
	fl.BoolVar(&cfg.MetricsPerSandbox, "metrics-per-sandbox", false, "add per-sandbox CPU, memory, disk and network gauges to /metrics (a series per sandbox and figure)")
	fl.IntVar(&cfg.FnCallPoolFloor, "fncall-pool-floor", 1, "fncall: warm sandboxes kept per pool (image and memory limit) even when idle")
	fl.BoolVar(&cfg.InitStub, "init-stub", false, "container sandboxes run the one-thread corral-initstub as PID 1 and start corral-init's server per exec (it lingers 2 s): about 2 host PIDs and 0.3 MiB per idle sandbox instead of 8 and 1.2, a slower first exec after a pause")
	fl.Float64Var(&cfg.InitStubServing, "init-stub-serving", 0.5, "with --init-stub: the share of container sandboxes whose server may run at once; admission keeps host PIDs free for that many servers (1: every sandbox, as without the stub), and an exec beyond it may be refused with resource exhausted")
	fl.IntVar(&cfg.WarmPool, "warm-pool", 2, "container sandboxes kept made ahead of demand per image (up to 4 images), handed to creates with the default resources and network none; 0: none")
	fl.IntVar(&cfg.Recycle, "recycle", 0, "deleted container sandboxes with network none kept per image (at most 256): a delete scrubs its sandbox (every process killed, IPC and PID counter reset; a fresh disk if it was written to; a network namespace of its own for the next tenant if the last one used the network) and the next create of the same project asking for the same resources takes it instead of making one; 0: every delete tears its sandbox down. With --init-stub, also the most recyclable sandboxes (corral-init as PID 1) an image has in use or pooled: creates beyond make stub sandboxes")
	fl.IntVar(&cfg.FnCallPoolCeiling, "fncall-pool-ceiling", 16, "fncall: most sandboxes per pool")
	fl.StringVar(&d.Image, "default-image", "", "image for requests that name none (default busybox)")
	fl.StringVar(&defMemory, "default-memory", "", "memory limit for requests that set none (default 512Mi)")
	fl.StringVar(&defDisk, "default-disk", "", "disk limit for requests that set none (default 1Gi)")
	fl.DurationVar(&d.IdleTimeout, "default-idle-timeout", 0, "idle timeout for requests that set none (default 30m)")
	fl.DurationVar(&d.MaxLifetime, "default-max-lifetime", 0, "lifetime for requests that set none (default 24h)")
	fl.StringVar(&cfg.Network.Bridge, "net-bridge", "corral0", "bridge that networked sandboxes' veths join (created on first use)")
	fl.StringVar(&subnet4, "net-subnet4", "100.96.0.0/16", "IPv4 addresses of networked sandboxes; the first is the gateway and DNS proxy")
	fl.StringVar(&subnet6, "net-subnet6", "fd63:6f72:7261:6c00::/64", "IPv6 addresses of networked sandboxes")
	fl.StringSliceVar(&cfg.Network.Upstreams, "net-dns-upstream", nil, "DNS servers (ip:port) the sandboxes' DNS proxy asks (default: /etc/resolv.conf's)")
	fl.StringArrayVar(&presets, "net-preset", nil, "a rule of a network preset, NAME=RULE (repeatable: the rules of one NAME add up and replace a default preset of that name)")
	fl.StringVar(&presetsFile, "net-presets-file", "", "JSON file {\"name\": [\"rule\", ...]} of network presets, merged over the defaults (pypi, npm, github, goproxy)")
	fl.StringVar(&cfg.Network.NodeNetns, "net-node-netns", "", "network namespace path for the node's side (bridge, NAT, DNS proxy); default the daemon's own")
	fl.IntVar(&cfg.Network.PoolSize, "net-pool", 4, "network namespaces kept ready for networked sandboxes")
	fl.IntVar(&cfg.Network.ConntrackPerSandbox, "net-conntrack-per-sandbox", 4096, "host conntrack entries one networked sandbox may hold; new flows beyond are dropped and counted")
	fl.Float64Var(&cfg.Network.DNS.Rate, "net-dns-rate", 100, "DNS queries per second one sandbox may make (burst twice that); the node's kernel drops beyond twice the rate")
	fl.StringVar(&bf.store, "blob-store", "none", "blob store shared with other nodes: none, s3://BUCKET[/PREFIX]?endpoint=HOST:PORT[&secure=true][&region=R] (credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; none: anonymous) http://PEER:PORT (another node's --blob-listen) or dir:/PATH (a directory, e.g. on a shared filesystem); layers this node lacks are then read lazily, layers it makes are published")
	fl.StringVar(&bf.chunk, "blob-chunk-size", "512Ki", "fetch chunk size of the blobs this node publishes (64Ki..2Mi, a power of two)")
	fl.StringVar(&bf.cache, "blob-cache-size", "0", "most bytes of lazily fetched chunks kept on disk, evicting the least recently used (0: no limit)")
	fl.DurationVar(&bf.timeout, "blob-fetch-timeout", 30*time.Second, "how long a read waits for a chunk from the blob store before it fails with EIO")
	fl.StringVar(&e2bCfg.Listen, "e2b-listen", "", "TCP address serving E2B's API (control and envd) for the unchanged e2b SDKs; empty disables it")
	fl.StringVar(&e2bCfg.APIKey, "e2b-api-key", "", "an operator X-API-KEY for the E2B API (e2b_ followed by hex digits), acting as the node administrator; corral tokens are accepted as keys without it")
	fl.StringVar(&e2bCfg.Domain, "e2b-domain", "localhost", "domain returned for E2B sandboxes: hosts <port>-<sandbox id>.<domain> route to them on --e2b-listen")
	fl.StringVar(&bf.listen, "blob-listen", "", "TCP address serving this node's blobs to peers (no authentication: node network only; needs --blob-store)")
	return cmd
}

// blobFlags are the serve flags of the shared blob store.
type blobFlags struct {
	store, chunk, cache, listen string
	timeout                     time.Duration
}

// config turns the flags into the server's blob config (nil: none).
func (f blobFlags) config() (*server.BlobsConfig, error) {
	if f.store == "" || f.store == "none" {
		if f.listen != "" {
			return nil, fmt.Errorf("--blob-listen needs --blob-store")
		}
		return nil, nil
	}
	st, err := parseBlobStore(f.store)
	if err != nil {
		return nil, err
	}
	bc := &server.BlobsConfig{Store: st, FetchTimeout: f.timeout, Listen: f.listen}
	if bc.ChunkSize, err = parseBytes("blob-chunk-size", f.chunk); err != nil {
		return nil, err
	}
	if bc.CacheBytes, err = parseBytes("blob-cache-size", f.cache); err != nil {
		return nil, err
	}
	if f.timeout <= 0 {
		return nil, fmt.Errorf("--blob-fetch-timeout: %s must be positive", f.timeout)
	}
	return bc, nil
}

// parseBlobStore reads --blob-store: s3://BUCKET[/PREFIX]?endpoint=… or a
// peer's http(s):// URL.
func parseBlobStore(s string) (blob.Config, error) {
	u, err := url.Parse(s)
	if err != nil {
		return blob.Config{}, fmt.Errorf("--blob-store: %w", err)
	}
	switch u.Scheme {
	case "dir":
		if u.Path == "" || !filepath.IsAbs(u.Path) {
			return blob.Config{}, fmt.Errorf("--blob-store %q: want dir:/ABSOLUTE/PATH", s)
		}
		return blob.Config{Kind: "dir", Dir: u.Path}, nil
	case "http", "https":
		return blob.Config{Kind: "http", URL: s}, nil
	case "s3":
		q := u.Query()
		c := blob.S3Config{Endpoint: q.Get("endpoint"), Bucket: u.Host, Region: q.Get("region"),
			AccessKey: os.Getenv("AWS_ACCESS_KEY_ID"), SecretKey: os.Getenv("AWS_SECRET_ACCESS_KEY")}
		if p := strings.Trim(u.Path, "/"); p != "" {
			c.Prefix = p + "/"
		}
		if v := q.Get("secure"); v != "" {
			if c.Secure, err = strconv.ParseBool(v); err != nil {
				return blob.Config{}, fmt.Errorf("--blob-store: secure=%q: want true or false", v)
			}
		}
		if c.Endpoint == "" || c.Bucket == "" {
			return blob.Config{}, fmt.Errorf("--blob-store %q: want s3://BUCKET?endpoint=HOST:PORT", s)
		}
		return blob.Config{Kind: "s3", S3: c}, nil
	}
	return blob.Config{}, fmt.Errorf("--blob-store %q: want none, s3://BUCKET?endpoint=HOST:PORT, http://PEER:PORT or dir:/PATH", s)
}

// netFlags fills the network config from the serve flags.
func netFlags(nc *netpolicy.Config, subnet4, subnet6, presetsFile string, presets []string) error {
	var err error
	if nc.Subnet4, err = netip.ParsePrefix(subnet4); err != nil {
		return fmt.Errorf("--net-subnet4: %w", err)
	}
	if nc.Subnet6, err = netip.ParsePrefix(subnet6); err != nil {
		return fmt.Errorf("--net-subnet6: %w", err)
	}
	nc.Presets = netpolicy.DefaultPresets()
	if presetsFile != "" {
		b, err := os.ReadFile(presetsFile)
		if err != nil {
			return fmt.Errorf("--net-presets-file: %w", err)
		}
		var m map[string][]string
		if err := json.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("--net-presets-file %s: %w", presetsFile, err)
		}
		maps.Copy(nc.Presets, m)
	}
	replaced := map[string]bool{}
	for _, p := range presets {
		name, rule, ok := strings.Cut(p, "=")
		if !ok || name == "" || rule == "" {
			return fmt.Errorf("--net-preset %q: want NAME=RULE", p)
		}
		if !replaced[name] {
			replaced[name] = true
			nc.Presets[name] = nil
		}
		nc.Presets[name] = append(nc.Presets[name], rule)
	}
	return nil
}

func joinErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
