package server

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/control"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/iam/etcdstore"
	"github.com/corral-dev/corral/internal/liveview"
)

// ClusterNodeConfig makes a server a node of a cluster (`corral serve
// --role node`).
type ClusterNodeConfig struct {
	Etcd   []string
	Secret cluster.Secret
	// TLS, when set, makes the cluster listener serve mutual TLS (with
	// no Secret, the client certificate alone authenticates a call).
	TLS *cluster.TLS
	// Advertise is the address control instances reach the node's cluster
	// listener at; the node listens there (a node-network address, which
	// sandboxes cannot reach: the node's own addresses are always denied
	// to them, and every call must be signed with Secret).
	Advertise string
	Labels    map[string]string
	Capacity  cluster.Capacity
	LeaseTTL  time.Duration
	// ReportInterval is how often the node reports its load (default 1s).
	ReportInterval time.Duration
}

// ClusterNode is a running cluster node: the server plus its registration
// and cluster listener.
type ClusterNode struct {
	*Server
	etcd      *clientv3.Client
	registrar *cluster.Registrar
	http      *http.Server
	addr      string
	// stopImages ends the sharing of image records (nil without a blob
	// store).
	stopImages func()
}

// Version is this build's version, as nodes report it.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}

// StartClusterNode starts the server and joins it to the cluster.
func StartClusterNode(ctx context.Context, cfg Config, cc ClusterNodeConfig) (*ClusterNode, error) {
	if len(cc.Etcd) == 0 {
		return nil, fmt.Errorf("--etcd: required with --role node")
	}
	if cc.Advertise == "" {
		return nil, fmt.Errorf("--advertise: required with --role node")
	}
	if len(cc.Secret) == 0 && cc.TLS == nil {
		return nil, fmt.Errorf("--cluster-secret-file or --cluster-tls-cert: required with --role node (control calls must be authenticated)")
	}
	if cc.Capacity.MemoryBytes == 0 {
		cc.Capacity.MemoryBytes = hostMemory()
	}
	if cc.Capacity.Sandboxes == 0 {
		cc.Capacity.Sandboxes = 3200
	}
	// The cluster's projects, tokens and quotas: admission of creates that
	// control instances forward checks them.
	cfg.IAMEtcd = cc.Etcd
	s, err := Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	cn := &ClusterNode{Server: s}
	if err := cn.join(ctx, cc); err != nil {
		cn.Stop(ctx)
		return nil, err
	}
	return cn, nil
}

func (cn *ClusterNode) join(ctx context.Context, cc ClusterNodeConfig) error {
	log := cn.cfg.Logger
	defaults := cn.node.Defaults()
	var err error
	if cn.etcd, err = cluster.Dial(cc.Etcd); err != nil {
		return err
	}
	acfg := cluster.AgentConfig{
		Sandboxes: cn.sandboxes, Capacity: cc.Capacity,
		DefaultCPUMillis: defaults.CPUMillis, DefaultMemoryBytes: defaults.MemoryBytes, Logger: log,
		// A real node lists its sandboxes at every report: its sandbox
		// summary (a lost node's listing) then misses none made before a
		// report, and sandboxes that stop by themselves leave its load at once.
		RecountInterval: cmp.Or(cc.ReportInterval, time.Second),
	}
	var ci *clusterImages
	if cn.share != nil {
		// With a shared blob store, images travel between nodes.
		ci = &clusterImages{etcd: cn.etcd, images: cn.images, share: cn.share, node: cn.node.ID(), log: log}
		acfg.Prepare = ci.prepare
		ictx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() { defer close(done); ci.run(ictx, 2*time.Second) }()
		cn.stopImages = func() { cancel(); <-done }
	}
	agent, err := cluster.NewNodeAgent(ctx, acfg)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	// Replies are small and many: compressing them costs more than
	// sending them (a seventh of the control plane's CPU per create).
	path, h := agent.Handler(cc.Secret, connect.WithInterceptors(control.ErrorInterceptor{}),
		connect.WithReadMaxBytes(80<<20), connect.WithCompressMinBytes(64<<10))
	mux.Handle(path, h)
	path, h = corralv1connect.NewFnCallServiceHandler(control.NewFnCallService(cn.fncall),
		connect.WithInterceptors(control.ErrorInterceptor{}), connect.WithReadMaxBytes(80<<20), connect.WithCompressMinBytes(64<<10))
	mux.Handle(path, cluster.RequireSigned(cc.Secret, h))
	// RolloutService calls carry the caller's principal: by-label calls are
	// scoped to its projects here, per-sandbox ones were checked by the
	// control instance's guard; forks are admitted by the agent.
	path, h = agent.RolloutHandler(control.NewRolloutService(cn.sandboxes), cc.Secret, connect.WithInterceptors(control.ErrorInterceptor{}))
	mux.Handle(path, h)
	// A migration's steps; snapshot files are not compressed (RAM and disk
	// images: gzip costs more CPU than the copy saves).
	path, h = agent.MigrationHandler(control.NewMigrationService(cn.sandboxes), cc.Secret, connect.WithInterceptors(control.ErrorInterceptor{}),
		connect.WithCompression("gzip", nil, nil), connect.WithReadMaxBytes(4<<20))
	mux.Handle(path, h)
	path, h = corralv1connect.NewImageServiceHandler(nodeImages{inner: control.NewImageService(cn.sandboxes, cn.images, cn.share), ci: ci},
		connect.WithInterceptors(control.ErrorInterceptor{}))
	mux.Handle(path, cluster.RequireSigned(cc.Secret, h))
	cn.serveClusterVM(mux, cc.Secret)
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	ln, err := net.Listen("tcp", cc.Advertise)
	if err != nil {
		return fmt.Errorf("cluster listener --advertise %s: %w", cc.Advertise, err)
	}
	cn.addr = ln.Addr().String()
	cn.http = &http.Server{Handler: mux, Protocols: protocols, ReadHeaderTimeout: 10 * time.Second}
	if cc.TLS != nil {
		protocols = new(http.Protocols)
		protocols.SetHTTP2(true)
		protocols.SetHTTP1(true) // the live view's websocket upgrades HTTP/1.1
		cn.http.Protocols, cn.http.TLSConfig = protocols, cc.TLS.ServerConfig()
		go func() { cn.served <- cn.http.ServeTLS(ln, "", "") }()
	} else {
		go func() { cn.served <- cn.http.Serve(ln) }()
	}

	var backends []string
	for _, b := range cn.stack.backends {
		backends = append(backends, b.Name())
	}
	cn.registrar, err = cluster.StartRegistrar(ctx, cluster.RegistrarConfig{
		Etcd: cn.etcd,
		Record: cluster.NodeRecord{
			ID: cn.node.ID(), Address: cn.addr, Version: Version(), Labels: cc.Labels,
			Backends: backends, Capacity: cc.Capacity,
		},
		LoadFunc: func(ctx context.Context) (cluster.Load, error) {
			l, err := agent.Measure(ctx)
			l.MemoryUsed, l.LoadAverage = hostMemory()-memAvailable(), loadAverage()
			return l, err
		},
		Summary: agent.Summary,
		TTL:     cc.LeaseTTL, Interval: cc.ReportInterval, Logger: log,
	})
	if err != nil {
		return err
	}
	log.Info("cluster node", "node", cn.node.ID(), "advertise", cn.addr, "labels", cc.Labels)
	return nil
}

// ClusterAddr is the bound cluster listener address.
func (cn *ClusterNode) ClusterAddr() string { return cn.addr }

// Stop leaves the cluster (revoking the lease; with CleanupOnExit also
// forgetting the node) and stops the server.
func (cn *ClusterNode) Stop(ctx context.Context) error {
	var errs []error
	if cn.registrar != nil {
		errs = append(errs, cn.registrar.Stop(ctx, cn.cfg.CleanupOnExit))
	}
	if cn.http != nil {
		errs = append(errs, cn.http.Close())
	}
	if cn.stopImages != nil {
		cn.stopImages()
	}
	if cn.etcd != nil {
		errs = append(errs, cn.etcd.Close())
	}
	return errors.Join(append(errs, cn.Server.Stop(ctx))...)
}

// meminfo reads one /proc/meminfo field in bytes.
func meminfo(field string) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if ok && name == field {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func hostMemory() int64   { return meminfo("MemTotal") }
func memAvailable() int64 { return meminfo("MemAvailable") }

func loadAverage() float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	f, _ := strconv.ParseFloat(strings.Fields(string(b) + " 0")[0], 64)
	return f
}

// ControlConfig configures a control instance (`corral serve --role
// control`).
type ControlConfig struct {
	Etcd   []string
	Secret cluster.Secret
	// TLS, when set, is mutual TLS towards the nodes.
	TLS *cluster.TLS
	// Listen is the public API's TCP address; Socket a unix socket ("":
	// none).
	Listen, Socket string
	Placer         cluster.PlacerConfig
	// OnPlace is told each placement decision's time (benchmarks).
	OnPlace func(time.Duration)
	Logger  *slog.Logger
}

// Control is a running control instance. It holds no per-sandbox state.
type Control struct {
	etcd      *clientv3.Client
	watcher   *cluster.Watcher
	claims    *cluster.Claims
	proxy     *cluster.Proxy
	iam       *iam.Service
	http      *http.Server
	listeners []net.Listener
	served    chan error
	liveView  *liveview.Handler // forwarded to nodes
}

// StartControl starts a control instance.
func StartControl(ctx context.Context, cc ControlConfig) (*Control, error) {
	if cc.Logger == nil {
		cc.Logger = slog.Default()
	}
	if len(cc.Etcd) == 0 {
		return nil, fmt.Errorf("--etcd: required with --role control")
	}
	cli, err := cluster.Dial(cc.Etcd)
	if err != nil {
		return nil, err
	}
	c := &Control{etcd: cli, served: make(chan error, 2)}
	if c.watcher, err = cluster.StartWatcher(ctx, cli, cc.Logger); err != nil {
		cli.Close()
		return nil, err
	}
	if c.claims, err = cluster.StartClaims(ctx, cli); err != nil {
		c.watcher.Close()
		cli.Close()
		return nil, err
	}
	placer := cluster.NewPlacer(cc.Placer, c.watcher.Snapshot)
	c.proxy = cluster.NewProxy(cluster.ProxyConfig{Watcher: c.watcher, Placer: placer, Secret: cc.Secret, TLS: cc.TLS, OnPlace: cc.OnPlace, Logger: cc.Logger,
		Quotas: c.quotaChain, Claims: c.claims})
	// IAM is the cluster's, in etcd: a token made through one control
	// instance (or a node) works through every other.
	c.iam = iam.New(iam.Config{Store: etcdstore.New(cli, etcdstore.DefaultPrefix), Logger: cc.Logger})
	images := ClusterImageService{etcd: cli, proxy: c.proxy}
	g := controlGuard(c.iam, c.proxy, images)
	guard := connect.WithInterceptors(control.ErrorInterceptor{}, g)
	mux := http.NewServeMux()
	path, h := corralv1connect.NewSandboxServiceHandler(c.proxy,
		guard, connect.WithReadMaxBytes(80<<20), connect.WithCompressMinBytes(64<<10))
	mux.Handle(path, h)
	path, h = corralv1connect.NewClusterServiceHandler(cluster.Service{W: c.watcher}, guard)
	mux.Handle(path, h)
	path, h = corralv1connect.NewImageServiceHandler(images, guard)
	mux.Handle(path, h)
	path, h = corralv1connect.NewFnCallServiceHandler(cluster.FnCalls{P: c.proxy},
		guard, connect.WithReadMaxBytes(80<<20), connect.WithCompressMinBytes(64<<10))
	mux.Handle(path, h)
	path, h = corralv1connect.NewRolloutServiceHandler(cluster.Rollouts{P: c.proxy}, guard)
	mux.Handle(path, h)
	path, h = corralv1connect.NewMigrationServiceHandler(cluster.Migrations{P: c.proxy}, guard)
	mux.Handle(path, h)
	path, h = corralv1connect.NewIAMServiceHandler(control.NewIAMService(c.iam, g.Images), guard)
	mux.Handle(path, h)
	path, h = corralv1connect.NewVMServiceHandler(ClusterVMService{proxy: c.proxy}, guard, connect.WithReadMaxBytes(80<<20))
	mux.Handle(path, h)
	// Viewers connect here with a node's token; the node checks it.
	c.liveView = &liveview.Handler{Open: c.proxy.OpenLiveView, Logger: cc.Logger}
	mux.Handle(liveview.PathPrefix, c.liveView)
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	// The socket's caller is the cluster administrator; TCP callers send a
	// token.
	c.http = &http.Server{Handler: mux, Protocols: protocols, ReadHeaderTimeout: 10 * time.Second, ConnContext: connContext}
	c.http.RegisterOnShutdown(c.liveView.Close)
	if cc.Listen != "" {
		ln, err := net.Listen("tcp", cc.Listen)
		if err != nil {
			c.Stop(ctx)
			return nil, fmt.Errorf("listen on %s: %w", cc.Listen, err)
		}
		c.listeners = append(c.listeners, ln)
	}
	if cc.Socket != "" {
		_ = os.Remove(cc.Socket)
		ln, err := net.Listen("unix", cc.Socket)
		if err == nil {
			err = os.Chmod(cc.Socket, 0o600)
		}
		if err != nil {
			c.Stop(ctx)
			return nil, fmt.Errorf("listen on %s: %w", cc.Socket, err)
		}
		c.listeners = append(c.listeners, ln)
	}
	for _, ln := range c.listeners {
		go func() { c.served <- c.http.Serve(ln) }()
	}
	cc.Logger.Info("corral control serving", "listen", cc.Listen, "socket", cc.Socket, "etcd", cc.Etcd)
	return c, nil
}

// quotaChain is the quotas placement checks a create of project against,
// over the whole cluster.
func (c *Control) quotaChain(ctx context.Context, project string) ([]cluster.ProjectQuota, error) {
	paths, quotas, err := c.iam.QuotaChain(ctx, project)
	if err != nil {
		return nil, err
	}
	out := make([]cluster.ProjectQuota, len(paths))
	for i := range paths {
		out[i] = cluster.ProjectQuota{Path: paths[i], Quota: quotas[i]}
	}
	return out, nil
}

// Addr is the TCP listener's address ("" without one).
func (c *Control) Addr() string {
	for _, ln := range c.listeners {
		if ln.Addr().Network() == "tcp" {
			return ln.Addr().String()
		}
	}
	return ""
}

// Watcher is the instance's view of the nodes.
func (c *Control) Watcher() *cluster.Watcher { return c.watcher }

// Wait blocks until a listener fails or ctx ends.
func (c *Control) Wait(ctx context.Context) error { return waitServed(ctx, c.served) }

// Stop stops serving.
func (c *Control) Stop(ctx context.Context) error {
	shut, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := c.http.Shutdown(shut)
	c.proxy.Close()
	c.claims.Close()
	c.watcher.Close()
	return errors.Join(err, c.iam.Close(), c.etcd.Close())
}
