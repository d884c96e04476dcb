// Package server wires one corral process together: the node (with its
// backends, image store and disk-quota store) and the control API, served
// over a unix socket and a loopback TCP port. It is the only package that
// knows every other one; nothing imports it but the CLI and tests.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/backend/container"
	"github.com/corral-dev/corral/internal/control"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/fncall"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/importroot"
	"github.com/corral-dev/corral/internal/liveview"
	"github.com/corral-dev/corral/internal/metrics"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/node"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/state"
	"github.com/corral-dev/corral/internal/storage/blob"
	image "github.com/corral-dev/corral/internal/storage/layers"
	layershare "github.com/corral-dev/corral/internal/storage/share"
	"github.com/corral-dev/corral/internal/swaparea"
)

// Config configures `corral serve`.
type Config struct {
	// DataDir holds state, images, writable layers and run files.
	DataDir string
	// Socket is the unix socket path (default <DataDir>/corral.sock).
	Socket string
	// Listen is a TCP address for the API ("" disables it). It should stay
	// on loopback: sandboxes have no route to it either way.
	Listen string
	// TLSCert and TLSKey serve the TCP listener over TLS (PEM files).
	TLSCert, TLSKey string
	// CgroupParent names the cgroup under which sandboxes are made.
	CgroupParent string
	// NodeCgroup names the daemon's own cgroup, beside the sandboxes'
	// parents, with a CPU weight far above theirs and (v2) memory.low
	// NodeMemoryLow ("": the daemon stays where it was started).
	NodeCgroup    string
	NodeMemoryLow int64
	// KeepCgroupMountOptions leaves the host's cgroup2 mount as it is;
	// by default the node turns on favordynmods (see cgroup.FavorDynMods).
	KeepCgroupMountOptions bool
	// RefusePageCacheProbes refuses, in container and fncall sandboxes,
	// the calls that tell whether a shared layer file is cached.
	RefusePageCacheProbes bool
	// LayerMounts is LayerMountsShared ("" too: one mount of each layer
	// for the node) or LayerMountsPerProject (each project its own).
	LayerMounts string
	// LayerWarmBytes is how much of each newly mounted layer the node
	// reads into the page cache, so that the pages are charged to it
	// rather than to the first sandbox that reads them (0:
	// image.DefaultWarmBudget; negative: none).
	LayerWarmBytes int64
	// InitBinary is the corral-init path (default: beside this executable).
	InitBinary string
	// InitStub makes the one-thread corral-initstub PID 1 of container
	// sandboxes (container.Config.Stub).
	InitStub bool
	// InitStubServing is the share of stub sandboxes that may serve at
	// once (hostlimit.Config.ServingShare); 0 means every one.
	InitStubServing float64
	// AgentBinary is the static corral-agent, the microVM guest's init
	// (default: beside this executable).
	AgentBinary string
	// MicroVMSnapshotAfter is how long a paused microVM (or vm sandbox
	// without network) keeps its RAM before its state goes to disk (0: at
	// once; negative: never).
	MicroVMSnapshotAfter time.Duration
	// DiskStore says how writable layers get disk limits: DiskStoreAuto
	// (default), DiskStoreXFS or DiskStoreExt4Image.
	DiskStore string
	// SwapBytes, when positive, is the size of the node's swap file (under
	// DataDir), where pause --reclaim pushes container memory.
	SwapBytes int64
	// DiskPoolBytes is the (sparse) size of the XFS filesystem holding
	// every sandbox's writable layer (DiskStoreXFS only).
	DiskPoolBytes int64
	// CleanupOnExit deletes every sandbox and unmounts the disk pool on
	// shutdown instead of leaving sandboxes running for the next start.
	CleanupOnExit bool
	// NoRaiseLimits leaves the host's limits (kernel.pid_max, the node's
	// RLIMIT_NOFILE) as they are; see internal/hostlimit.
	NoRaiseLimits bool
	Defaults      node.Defaults
	// FnCallPoolFloor and FnCallPoolCeiling bound each fncall pool (per
	// image and memory limit); zero takes fncall's defaults.
	FnCallPoolFloor, FnCallPoolCeiling int
	// WarmPool is how many container sandboxes the node keeps made ahead
	// of demand per image (node.Config.WarmPool); 0: none.
	WarmPool int
	// Recycle is how many deleted container sandboxes with network none
	// the node keeps per image, scrubbed, for the next creates of the same
	// project asking for the same resources (node.Config.Recycle); 0:
	// none. With InitStub, each image's recyclable sandboxes, in use or
	// pooled, are bounded by it too (node.Config.BoundRecyclable): a
	// recyclable sandbox keeps corral-init as PID 1.
	Recycle int
	// Snapshots bound the snapshots the node keeps
	// (node.Config.Snapshots; zero fields take the node's defaults).
	Snapshots node.SnapshotLimits
	// Network configures sandbox networking (bridge, NAT, DNS proxy,
	// presets). Nothing on the host changes until a sandbox asks for a
	// network mode other than none.
	Network netpolicy.Config
	// Blobs shares layers through a blob store (nil: every layer is local).
	Blobs  *BlobsConfig
	Logger *slog.Logger
	// MetricsPerSandbox adds per-sandbox CPU, memory, disk and network
	// gauges to /metrics (a series per sandbox: off by default).
	MetricsPerSandbox bool
	// ImportRoot is the directory under which the node administrator may
	// name node paths in layer create and image import ("": none).
	ImportRoot string
	// E2B serves E2B's API (nil: not served).
	E2B *E2BConfig
	// IAMEtcd, when set, keeps IAM records in this etcd (a cluster node:
	// the cluster's projects, tokens and quotas) instead of iam.db.
	IAMEtcd []string
	// SandboxCACerts is a PEM file or a directory of them whose
	// certificates every sandbox (container, fncall, microvm, vm) trusts
	// besides its image's ("": none); see caImages.
	SandboxCACerts string
}

// BlobsConfig configures the blob store layers are shared through.
type BlobsConfig struct {
	// Store is the shared store (s3, or http: another node's --blob-listen).
	Store blob.Config
	// ChunkSize is the fetch chunk size of blobs this node publishes.
	ChunkSize int64
	// CacheBytes bounds the chunk cache (0: lazyblob's default).
	CacheBytes int64
	// FetchTimeout bounds a chunk fetch before the reader gets EIO.
	FetchTimeout time.Duration
	// Listen is a TCP address serving this node's blobs to peers (""
	// disables it). It has no authentication: bind it to the node network.
	Listen string
	// ServerArgv runs the lazy blob server (default: this executable's
	// hidden lazyblob-serve command).
	ServerArgv []string
}

// Server is a running corral process.
type Server struct {
	cfg      Config
	node     *node.Node
	swap     *swaparea.Area // nil without Config.SwapBytes
	fncall   *fncall.Service
	stack    *stack
	images   *image.Store
	iam      *iam.Service
	share    *layershare.Share // nil without Config.Blobs
	blobHTTP *http.Server      // peer blob fetch, nil unless Blobs.Listen
	blobAddr string
	// stopMonitor ends the lazy fault monitor (nil without a share).
	stopMonitor func()
	events      *events.Log
	metrics     *metrics.Metrics
	http        *http.Server
	e2bHTTP     *http.Server // nil unless E2B.Listen
	e2bAddr     string
	listeners   []net.Listener
	served      chan error
	claims      cgroupClaims // the cgroup parents, held until Stop ends

	// sandboxes is the node's SandboxService, also served to control
	// instances in a cluster (cluster.go).
	sandboxes *control.Service

	// nodeGroup is the daemon's own cgroup (nil without Config.NodeCgroup).
	nodeGroup *cgroup.NodeGroup

	// vmService is the node's VMService and liveView the live view's
	// websocket endpoint (vm.go), whose connections outlive Shutdown,
	// which closes them.
	vmService *control.VMService
	liveView  *liveview.Handler
}

// maxRecycle bounds Config.Recycle: each pooled sandbox holds its init, a
// disk and its cgroups.
const maxRecycle = 256

// Start builds the node and starts serving. Stop ends it.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(cfg.DataDir, "corral.sock")
	}
	if cfg.Recycle < 0 || cfg.Recycle > maxRecycle {
		return nil, errdefs.InvalidArgument("recycle: %d is out of range (0 to %d sandboxes per image)", cfg.Recycle, maxRecycle)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	claims, err := claimCgroupParents(cfg)
	if err != nil {
		return nil, err
	}
	nodeGroup, err := enterNodeCgroup(cfg)
	if err != nil {
		_ = claims.release()
		return nil, err
	}
	served := false
	defer func() {
		if !served {
			_ = nodeGroup.Release()
			_ = claims.release()
		}
	}()
	if err := checkTLS(cfg); err != nil {
		return nil, err
	}
	if err := checkLayerMounts(cfg.LayerMounts); err != nil {
		return nil, err
	}
	iamSvc, err := openIAM(ctx, cfg)
	if err != nil {
		return nil, err
	}
	images, share, err := openImages(ctx, cfg)
	if err != nil {
		iamSvc.Close()
		return nil, err
	}
	// closeImages undoes openImages (and openIAM) when a later step fails:
	// as Stop does, with CleanupOnExit the layer mounts and the lazy blob
	// server go too.
	closeImages := func() {
		images.Close(cfg.CleanupOnExit)
		if share != nil {
			_ = share.Close(ctx, cfg.CleanupOnExit)
		}
		iamSvc.Close()
	}
	if _, err := images.Build(ctx, "busybox", nil); err != nil {
		closeImages()
		return nil, fmt.Errorf("build the busybox image: %w", err)
	}
	db, err := state.Open(node.StatePath(cfg.DataDir))
	if err != nil {
		closeImages()
		return nil, err
	}
	st, err := newStack(ctx, cfg, db)
	if err != nil {
		db.Close()
		closeImages()
		return nil, err
	}
	var nodeImages node.Images = images
	if share != nil {
		nodeImages = lazyImages{Store: images, share: share, parent: cgroupParent(cfg), log: cfg.Logger}
	}
	var fnImages fncall.Images = images
	if cfg.SandboxCACerts != "" {
		ca, err := newCAImages(nodeImages, cfg.SandboxCACerts, cfg.DataDir)
		if err != nil {
			st.close(ctx, cfg.CleanupOnExit)
			closeImages()
			return nil, err
		}
		nodeImages, fnImages = ca, caFnImages{Images: images, ca: ca}
	}
	evlog, err := events.Open(filepath.Join(cfg.DataDir, "events"), cfg.Logger)
	if err != nil {
		st.close(ctx, cfg.CleanupOnExit)
		closeImages()
		return nil, err
	}
	guard, err := openHostLimits(cfg)
	if err != nil {
		evlog.Close()
		st.close(ctx, cfg.CleanupOnExit)
		closeImages()
		return nil, err
	}
	swap, err := setupSwap(cfg)
	if err != nil {
		evlog.Close()
		st.close(ctx, cfg.CleanupOnExit)
		closeImages()
		return nil, err
	}
	reg := metrics.New()
	n, err := node.New(ctx, node.Config{
		Swap:     swap != nil,
		DataDir:  cfg.DataDir,
		State:    db,
		Backends: st.backends,
		Images:   nodeImages,
		Defaults: cfg.Defaults,
		Logger:   cfg.Logger,
		Events:   evlog,
		Metrics:  reg,
		Admit:    admitAll(admitWith(iamSvc), hostAdmit(guard)),
		// A request's I/O limits are bounded by the container backend's.
		Limits: node.Limits{MaxIO: state.IOLimits(container.DefaultIO)},

		PerProjectLayerMounts: cfg.LayerMounts == LayerMountsPerProject,
		WarmPool:              cfg.WarmPool,
		Recycle:               cfg.Recycle,
		BoundRecyclable:       cfg.InitStub,
		Snapshots:             cfg.Snapshots,
	})
	if err != nil {
		swap.Close()
		evlog.Close()
		st.close(ctx, cfg.CleanupOnExit)
		closeImages()
		return nil, err
	}
	fc, err := fncall.New(fncall.Config{
		Backend: st.container, Images: fnImages, Logger: cfg.Logger,
		PoolFloor: cfg.FnCallPoolFloor, PoolCeiling: cfg.FnCallPoolCeiling,
	})
	if err != nil {
		n.Close()
		swap.Close()
		evlog.Close()
		st.close(ctx, cfg.CleanupOnExit)
		closeImages()
		return nil, err
	}
	s := &Server{cfg: cfg, node: n, swap: swap, fncall: fc, stack: st, images: images, iam: iamSvc, share: share, served: make(chan error, 4), claims: claims, nodeGroup: nodeGroup,
		events: evlog, metrics: reg}
	s.registerCollectors(reg)
	if share != nil {
		mctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			republish(mctx, share, images, cfg.Logger)
			share.Monitor(mctx, images.Layers, n)
		}()
		s.stopMonitor = func() { cancel(); <-done }
	}
	if err := s.listen(); err != nil {
		s.Stop(ctx)
		return nil, err
	}
	cfg.Logger.Info("corral serving", "node", n.ID(), "socket", cfg.Socket, "listen", cfg.Listen, "data_dir", cfg.DataDir)
	served = true
	return s, nil
}

func (s *Server) listen() error {
	mux := http.NewServeMux()
	g := s.guard()
	sandboxes := control.NewService(s.node)
	// counted outermost: it records the code the client sees. Replies
	// below 64 KiB go uncompressed: most are a few bytes, and gzipping
	// one cost more than sending it (a gzip writer's reset was 4% of the
	// daemon's CPU per exec, 5% per fncall call, 15% per WhoAmI).
	guard := connect.WithHandlerOptions(
		connect.WithInterceptors(control.MetricsInterceptor{M: s.metrics}, control.ErrorInterceptor{}, g),
		connect.WithCompressMinBytes(64<<10))
	s.sandboxes = sandboxes
	path, h := corralv1connect.NewSandboxServiceHandler(sandboxes, guard, connect.WithReadMaxBytes(80<<20))
	mux.Handle(path, h)
	if s.share != nil {
		sandboxes.SetLazyReads(s.lazyReads)
	}
	s.observeRoutes(mux, guard)
	path, h = corralv1connect.NewRolloutServiceHandler(control.NewRolloutService(sandboxes), guard)
	mux.Handle(path, h)
	importRoot, err := importroot.New(s.cfg.ImportRoot)
	if err != nil {
		return err
	}
	imageSvc := control.NewImageService(sandboxes, s.images, s.share)
	imageSvc.SetImportRoot(importRoot)
	path, h = corralv1connect.NewImageServiceHandler(imageSvc, guard)
	mux.Handle(path, h)
	path, h = corralv1connect.NewFnCallServiceHandler(control.NewFnCallService(s.fncall), guard, connect.WithReadMaxBytes(80<<20))
	mux.Handle(path, h)
	s.serveIAM(mux, g.Images, guard)
	s.serveVM(mux, sandboxes, guard)
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	protocols.SetHTTP2(true)
	s.http = &http.Server{Handler: mux, Protocols: protocols, ReadHeaderTimeout: 10 * time.Second, ConnContext: connContext}
	// Event streams never end on their own: end them so Shutdown need not wait.
	s.http.RegisterOnShutdown(s.events.EndWatches)
	s.http.RegisterOnShutdown(s.liveView.Close)

	_ = os.Remove(s.cfg.Socket) // a stale socket from a crashed run
	unixLn, err := net.Listen("unix", s.cfg.Socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.Socket, err)
	}
	if err := os.Chmod(s.cfg.Socket, 0o600); err != nil {
		unixLn.Close()
		return fmt.Errorf("chmod %s: %w", s.cfg.Socket, err)
	}
	s.listeners = append(s.listeners, unixLn)
	if s.cfg.Listen != "" {
		tcpLn, err := net.Listen("tcp", s.cfg.Listen)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", s.cfg.Listen, err)
		}
		s.listeners = append(s.listeners, tcpLn)
	}
	go func() { s.served <- s.http.Serve(unixLn) }()
	if len(s.listeners) > 1 {
		go func() { s.served <- s.serveTCP(s.listeners[1]) }()
	}
	if err := s.listenE2B(sandboxes, g); err != nil {
		return err
	}
	return s.listenBlobs()
}

// listenBlobs serves this node's blobs to peers on Blobs.Listen: a
// listener of its own, never the API's.
func (s *Server) listenBlobs() error {
	if s.share == nil || s.cfg.Blobs.Listen == "" {
		return nil
	}
	st, err := s.share.PeerStore()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.cfg.Blobs.Listen)
	if err != nil {
		return fmt.Errorf("--blob-listen %s: %w", s.cfg.Blobs.Listen, err)
	}
	mux := http.NewServeMux()
	mux.Handle(blob.HTTPPrefix, blob.Handler(st, s.cfg.Logger))
	s.blobHTTP = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	s.blobAddr = ln.Addr().String()
	go func() { s.served <- s.blobHTTP.Serve(ln) }()
	s.cfg.Logger.Info("serving blobs to peers", "listen", s.blobAddr)
	return nil
}

// openImages opens the image store; with cfg.Blobs, over a share of the
// blob store: layers this node lacks are read lazily, layers it makes are
// published.
func openImages(ctx context.Context, cfg Config) (*image.Store, *layershare.Share, error) {
	dir := filepath.Join(cfg.DataDir, "images")
	var opts []image.Option
	if cfg.LayerWarmBytes != 0 {
		opts = append(opts, image.WithWarmBudget(max(cfg.LayerWarmBytes, 0)))
	}
	if cfg.Blobs == nil {
		images, err := image.Open(ctx, dir, opts...)
		return images, nil, err
	}
	argv := cfg.Blobs.ServerArgv
	if len(argv) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, nil, fmt.Errorf("lazy blob server: %w", err)
		}
		argv = []string{exe, "lazyblob-serve"}
	}
	share, err := layershare.Open(ctx, layershare.Config{
		Store:        cfg.Blobs.Store,
		ChunkSize:    cfg.Blobs.ChunkSize,
		Dir:          filepath.Join(cfg.DataDir, "lazyblob"),
		CacheLimit:   cfg.Blobs.CacheBytes,
		FetchTimeout: cfg.Blobs.FetchTimeout,
		LocalBlobs:   filepath.Join(dir, image.BlobsDirName),
		ServerArgv:   argv,
		Logger:       cfg.Logger,
	})
	if err != nil {
		return nil, nil, err
	}
	images, err := image.Open(ctx, dir, append(opts, image.WithBlobSource(share), image.WithPublisher(share))...)
	if err != nil {
		_ = share.Close(ctx, cfg.CleanupOnExit)
		return nil, nil, err
	}
	return images, share, nil
}

// republish publishes the layers a failed or earlier publish left out.
func republish(ctx context.Context, share *layershare.Share, images *image.Store, log *slog.Logger) {
	layers, err := images.Layers(ctx)
	if err == nil {
		err = share.PublishMissing(ctx, layers, images.LayerFiles)
	}
	if err != nil && ctx.Err() == nil {
		log.Warn("publish layers", "err", err)
	}
}

// lazyReads reports sandbox id's reads of lazily loaded layers.
func (s *Server) lazyReads(ctx context.Context, id string) (*corralv1.LazyReadStats, error) {
	parent := cgroupParent(s.cfg)
	g, err := s.share.SandboxReads(ctx, parent, parent+cgroup.IdleSuffix, id)
	if err != nil {
		return nil, err
	}
	return &corralv1.LazyReadStats{BytesRead: g.BytesRead, BytesFetched: g.BytesFetched,
		Hits: g.Hits, Misses: g.Misses, HitRate: g.HitRate}, nil
}

// cgroupParent is the cgroup sandboxes go under (the container backend's
// default when unset).
func cgroupParent(cfg Config) string {
	if cfg.CgroupParent == "" {
		return "corral"
	}
	return cfg.CgroupParent
}

// lazyImages is the image store as the node sees it when layers may be
// read lazily: releasing a deleted sandbox's layers also drops its read
// figures in the lazy blob server.
type lazyImages struct {
	*image.Store
	share  *layershare.Share
	parent string
	log    *slog.Logger
}

func (l lazyImages) Release(holder string) {
	l.Store.Release(holder)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := l.share.ForgetSandbox(ctx, l.parent, l.parent+cgroup.IdleSuffix, holder); err != nil {
		l.log.Debug("forget a sandbox's lazy read figures", "sandbox", holder, "err", err)
	}
}

// NodeID is the id of this server's node.
func (s *Server) NodeID() string { return s.node.ID() }

// TCPAddr is the bound TCP address, or "" when TCP is off.
func (s *Server) TCPAddr() string {
	if len(s.listeners) < 2 {
		return ""
	}
	return s.listeners[1].Addr().String()
}

// Wait blocks until a listener fails or ctx ends.
func (s *Server) Wait(ctx context.Context) error { return waitServed(ctx, s.served) }

// waitServed blocks until a listener's Serve returns on served (a closed
// server is no failure) or ctx ends.
func waitServed(ctx context.Context, served <-chan error) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-served:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// Stop stops serving. Sandboxes keep running for the next start unless
// CleanupOnExit is set.
func (s *Server) Stop(ctx context.Context) error {
	var errs []error
	if s.http != nil {
		shutCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		errs = append(errs, s.http.Shutdown(shutCtx))
		cancel()
	}
	errs = append(errs, s.stopE2B(ctx))
	// Pooled sandboxes never outlive the server: they hold no state.
	errs = append(errs, s.fncall.Close(ctx))
	if s.cfg.CleanupOnExit {
		errs = append(errs, s.node.Shutdown(ctx))
	} else {
		errs = append(errs, s.node.Close())
	}
	errs = append(errs, s.swap.Close())
	errs = append(errs, s.events.Close())
	errs = append(errs, s.stack.close(ctx, s.cfg.CleanupOnExit))
	// Layer mounts stay for sandboxes that outlive the server.
	errs = append(errs, s.images.Close(s.cfg.CleanupOnExit))
	if s.blobHTTP != nil {
		errs = append(errs, s.blobHTTP.Close())
	}
	if s.stopMonitor != nil {
		s.stopMonitor()
	}
	if s.share != nil {
		// Lazy layers are unmounted by now when cleaning up; otherwise the
		// lazy blob server keeps serving sandboxes that outlive us.
		errs = append(errs, s.share.Close(ctx, s.cfg.CleanupOnExit))
	}
	if s.cfg.CleanupOnExit {
		_ = os.Remove(s.cfg.Socket)
	}
	errs = append(errs, s.nodeGroup.Release())
	errs = append(errs, s.claims.release())
	errs = append(errs, s.iam.Close())
	return errors.Join(errs...)
}
