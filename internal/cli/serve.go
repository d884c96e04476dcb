package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/node"
	"github.com/corral-dev/corral/internal/server"
)

func newServeCmd() *cobra.Command {
	var cfg server.Config
	var logLevel, diskPool, defMemory, defDisk string
	var d node.Defaults
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
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			var err error
			if cfg.DiskPoolBytes, err = parseBytes("disk-pool", diskPool); err != nil {
				return err
			}
			if d.MemoryBytes, err = parseBytes("default-memory", defMemory); err != nil {
				return err
			}
			if d.DiskBytes, err = parseBytes("default-disk", defDisk); err != nil {
				return err
			}
			cfg.Defaults = d
			if os.Geteuid() != 0 {
				return fmt.Errorf("corral serve must run as root (it creates namespaces, mounts and cgroups)")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			srv, err := server.Start(ctx, cfg)
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
	fl.StringVar(&cfg.DataDir, "data-dir", "/var/lib/corral", "state, images, writable layers and run files")
	fl.StringVar(&cfg.Socket, "socket", "", "unix socket for the API (default <data-dir>/corral.sock)")
	fl.StringVar(&cfg.Listen, "listen", "127.0.0.1:7070", "TCP address for the API; empty disables it")
	fl.StringVar(&cfg.CgroupParent, "cgroup-parent", "corral", "cgroup under which sandboxes are created")
	fl.BoolVar(&cfg.KeepCgroupMountOptions, "keep-cgroup-mount-options", false,
		"do not turn on the host's cgroup2 favordynmods option (which makes sandbox creation ~10 ms faster on cgroup v1 hosts)")
	fl.StringVar(&cfg.InitBinary, "init-binary", "", "path of corral-init (default: beside this binary)")
	fl.StringVar(&cfg.AgentBinary, "agent-binary", "", "path of the static corral-agent, init of microVM guests (default: beside this binary)")
	fl.DurationVar(&cfg.MicroVMSnapshotAfter, "microvm-snapshot-after", time.Minute,
		"how long a paused microVM keeps its RAM before its memory and device state go to disk and its VMM exits (0: at pause; negative: never)")
	fl.StringVar(&cfg.DiskStore, "disk-store", server.DiskStoreAuto, "how sandbox disks are limited: auto (xfs when the kernel has XFS quota, else ext4-image), xfs or ext4-image")
	fl.StringVar(&diskPool, "disk-pool", "64Gi", "size of the sparse XFS filesystem holding all writable layers (--disk-store xfs)")
	fl.BoolVar(&cfg.CleanupOnExit, "cleanup-on-exit", false, "delete every sandbox when the daemon exits")
	fl.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fl.IntVar(&cfg.FnCallPoolFloor, "fncall-pool-floor", 1, "fncall: warm sandboxes kept per pool (image and memory limit) even when idle")
	fl.IntVar(&cfg.FnCallPoolCeiling, "fncall-pool-ceiling", 16, "fncall: most sandboxes per pool")
	fl.StringVar(&d.Image, "default-image", "", "image for requests that name none (default busybox)")
	fl.StringVar(&defMemory, "default-memory", "", "memory limit for requests that set none (default 512Mi)")
	fl.StringVar(&defDisk, "default-disk", "", "disk limit for requests that set none (default 1Gi)")
	fl.DurationVar(&d.IdleTimeout, "default-idle-timeout", 0, "idle timeout for requests that set none (default 30m)")
	fl.DurationVar(&d.MaxLifetime, "default-max-lifetime", 0, "lifetime for requests that set none (default 24h)")
	return cmd
}

func joinErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
