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

	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/control"
	"github.com/corral-dev/corral/internal/fncall"
	"github.com/corral-dev/corral/internal/image"
	"github.com/corral-dev/corral/internal/node"
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
	// CgroupParent names the cgroup under which sandboxes are made.
	CgroupParent string
	// KeepCgroupMountOptions leaves the host's cgroup2 mount as it is;
	// by default the node turns on favordynmods (see cgroup.FavorDynMods).
	KeepCgroupMountOptions bool
	// InitBinary is the corral-init path (default: beside this executable).
	InitBinary string
	// AgentBinary is the static corral-agent, the microVM guest's init
	// (default: beside this executable).
	AgentBinary string
	// MicroVMSnapshotAfter is how long a paused microVM keeps its RAM
	// before its state goes to disk (0: at once; negative: never).
	MicroVMSnapshotAfter time.Duration
	// DiskStore says how writable layers get disk limits: DiskStoreAuto
	// (default), DiskStoreXFS or DiskStoreExt4Image.
	DiskStore string
	// DiskPoolBytes is the (sparse) size of the XFS filesystem holding
	// every sandbox's writable layer (DiskStoreXFS only).
	DiskPoolBytes int64
	// CleanupOnExit deletes every sandbox and unmounts the disk pool on
	// shutdown instead of leaving sandboxes running for the next start.
	CleanupOnExit bool
	Defaults      node.Defaults
	// FnCallPoolFloor and FnCallPoolCeiling bound each fncall pool (per
	// image and memory limit); zero takes fncall's defaults.
	FnCallPoolFloor, FnCallPoolCeiling int
	Logger                             *slog.Logger
}

// Server is a running corral process.
type Server struct {
	cfg       Config
	node      *node.Node
	fncall    *fncall.Service
	stack     *stack
	images    *image.Store
	http      *http.Server
	listeners []net.Listener
	served    chan error
}

// Start builds the node and starts serving. Stop ends it.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(cfg.DataDir, "corral.sock")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	images, err := image.Open(ctx, filepath.Join(cfg.DataDir, "images"))
	if err != nil {
		return nil, err
	}
	if _, err := images.Build(ctx, "busybox", nil); err != nil {
		images.Close(false)
		return nil, fmt.Errorf("build the busybox image: %w", err)
	}
	st, err := newStack(ctx, cfg)
	if err != nil {
		images.Close(false)
		return nil, err
	}
	n, err := node.New(ctx, node.Config{
		DataDir:  cfg.DataDir,
		Backends: st.backends,
		Images:   images,
		Defaults: cfg.Defaults,
		Logger:   cfg.Logger,
	})
	if err != nil {
		st.close(ctx, false)
		images.Close(false)
		return nil, err
	}
	fc, err := fncall.New(fncall.Config{
		Backend: st.container, Images: images, Logger: cfg.Logger,
		PoolFloor: cfg.FnCallPoolFloor, PoolCeiling: cfg.FnCallPoolCeiling,
	})
	if err != nil {
		n.Close()
		st.close(ctx, false)
		images.Close(false)
		return nil, err
	}
	s := &Server{cfg: cfg, node: n, fncall: fc, stack: st, images: images, served: make(chan error, 2)}
	if err := s.listen(); err != nil {
		s.Stop(ctx)
		return nil, err
	}
	cfg.Logger.Info("corral serving", "node", n.ID(), "socket", cfg.Socket, "listen", cfg.Listen, "data_dir", cfg.DataDir)
	return s, nil
}

func (s *Server) listen() error {
	mux := http.NewServeMux()
	path, h := corralv1connect.NewSandboxServiceHandler(control.NewService(s.node),
		connect.WithInterceptors(control.ErrorInterceptor{}),
		connect.WithReadMaxBytes(80<<20))
	mux.Handle(path, h)
	// Calls are small and many: compressing a short reply costs more than
	// sending it (a gzip writer's reset was ~5% of a call's server CPU).
	path, h = corralv1connect.NewFnCallServiceHandler(control.NewFnCallService(s.fncall),
		connect.WithInterceptors(control.ErrorInterceptor{}),
		connect.WithReadMaxBytes(80<<20), connect.WithCompressMinBytes(64<<10))
	mux.Handle(path, h)
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	s.http = &http.Server{Handler: mux, Protocols: protocols, ReadHeaderTimeout: 10 * time.Second}

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
	for _, ln := range s.listeners {
		go func() { s.served <- s.http.Serve(ln) }()
	}
	return nil
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
func (s *Server) Wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-s.served:
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
	// Pooled sandboxes never outlive the server: they hold no state.
	errs = append(errs, s.fncall.Close(ctx))
	if s.cfg.CleanupOnExit {
		errs = append(errs, s.node.Shutdown(ctx))
	} else {
		errs = append(errs, s.node.Close())
	}
	errs = append(errs, s.stack.close(ctx, s.cfg.CleanupOnExit))
	// Layer mounts stay for sandboxes that outlive the server.
	errs = append(errs, s.images.Close(s.cfg.CleanupOnExit))
	if s.cfg.CleanupOnExit {
		_ = os.Remove(s.cfg.Socket)
	}
	return errors.Join(errs...)
}
