// Package container is the "container" backend: each sandbox is a
// corral-init process in fresh PID/mount/UTS/IPC/net/cgroup namespaces, in
// its own cgroups, on an overlay of read-only layers and a writable layer
// from an upper.Store (host dirs, or an ext4 disk device that init mounts
// inside the sandbox). It owns the sandbox's run dir (control socket, rootfs
// and disk mount points), cgroups and init process, and delegates file
// operations to safefs. It imports backend, errdefs, safefs, storage/upper
// (the store interface), loopdev, netpolicy, guest/initproto (init's
// protocol) and the runtime packages; never
// the node, control, state or API layers, nor the layer, blob or
// writable-layer store implementations (internal/deptest).
package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/runtime/launch"
	"github.com/corral-dev/corral/internal/runtime/seccomp"
	"github.com/corral-dev/corral/internal/runtime/userns"
	"github.com/corral-dev/corral/internal/storage/upper"
)

// Config configures the backend.
type Config struct {
	// RunDir holds one 0700 directory per sandbox (control socket, rootfs
	// mount point, init log). Required.
	RunDir string
	// CgroupParent is the cgroup directory name sandboxes go under, in every
	// hierarchy. Default "corral".
	CgroupParent string
	// InitPath is the corral-init binary. Default: corral-init beside
	// os.Executable().
	InitPath string
	// Stub makes corral-initstub (beside InitPath) PID 1 of every
	// non-pooled sandbox: an idle sandbox is one single-threaded task, and
	// corral-init's Go server starts per exec and lingers 2 s (fewer host
	// PIDs and less memory per idle sandbox, a slower first exec after a
	// pause; docs/lifecycle.md). Off: corral-init stays PID 1.
	Stub bool
	// Uppers provides writable layers. Required (upper.DirStore for no
	// quota).
	Uppers upper.Store
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// FavorDynMods turns on the host's cgroup2 favordynmods mount option
	// (see cgroup.FavorDynMods): create latency drops by a grace period.
	FavorDynMods bool
	// Shell is a host path of a static POSIX shell (busybox) that every
	// sandbox gets read-only at initproto.ShellPath and that runs shell
	// execs, out of the agent's reach. Empty: shell execs use the image's
	// /bin/sh.
	Shell string
	// NoSeccomp skips the seccomp filter (runtime tests only).
	NoSeccomp bool
	// Network wires sandboxes with a network mode other than none; nil:
	// such sandboxes are refused as not supported.
	Network *netpolicy.Manager
	// IDRanges hands out each sandbox's host uid/gid range (its user
	// namespace), persisted by the node's state. Default: ranges kept in
	// memory, unique within this process only.
	IDRanges *userns.Allocator
	// IO limits each sandbox's I/O on its writable layer's device;
	// zero: DefaultIO.
	IO cgroup.IOLimits
	// RefusePageCacheProbes refuses mincore, cachestat and RWF_NOWAIT in
	// sandboxes (seccomp.Profile.WithoutPageCacheProbes).
	RefusePageCacheProbes bool
}

// Backend implements backend.Backend.
type Backend struct {
	cfg Config
	// seccomp is the sandbox filter, compiled once (seccomp.Encode form).
	seccomp []byte
	// poolSeccomp is the filter of a resettable sandbox's init, on which
	// seccomp is stacked for its commands.
	poolSeccomp []byte
	cg          *cgroup.Manager
	cgIdle      *cgroup.Manager // best-effort sandboxes (cgroup.Manager.Idle)
	log         *slog.Logger
	// spawner clones inits, so that the daemon does not fork itself.
	spawner *launch.Spawner
	// stub is the path of corral-initstub, opened for every non-pooled
	// init (the node holds no fd of it between creates: the sandbox gets
	// no open file of the node); empty: none.
	stub string
}

var _ backend.Backend = (*Backend)(nil)

// New checks the config and the host (cgroups) and returns the backend.
func New(cfg Config) (*Backend, error) {
	if cfg.RunDir == "" || cfg.Uppers == nil {
		return nil, errdefs.InvalidArgument("container backend: RunDir and Uppers are required")
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "corral"
	}
	var err error
	if cfg.InitPath, err = backend.SandboxBinary(cfg.InitPath, "corral-init", "Config.InitPath"); err != nil {
		return nil, fmt.Errorf("container backend: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.IO == (cgroup.IOLimits{}) {
		cfg.IO = DefaultIO
	}
	if cfg.IDRanges == nil {
		cfg.IDRanges = userns.NewAllocator(&userns.MemSlots{})
	}
	cg, err := cgroup.NewManager(cfg.CgroupParent)
	if err != nil {
		return nil, errdefs.NotSupported("container backend: %v", err)
	}
	var filter, poolFilter []byte
	if !cfg.NoSeccomp {
		prof := seccomp.DefaultProfile()
		if cfg.RefusePageCacheProbes {
			prof = prof.WithoutPageCacheProbes()
		}
		if filter, err = compile(prof); err != nil {
			return nil, err
		}
		if poolFilter, err = compile(seccomp.PoolInitProfile()); err != nil {
			return nil, err
		}
	}
	if cfg.FavorDynMods {
		changed, err := cgroup.FavorDynMods()
		switch {
		case err != nil:
			cfg.Logger.Warn("cgroup moves stay slow (each waits for an RCU grace period)", "err", err)
		case changed:
			cfg.Logger.Info("turned on cgroup2 favordynmods: moving a sandbox into its cgroups no longer waits for an RCU grace period")
		}
	}
	if err := os.MkdirAll(cfg.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("container backend: run dir: %w", err)
	}
	stub, err := findStub(cfg)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With("backend", "container")
	return &Backend{cfg: cfg, seccomp: filter, poolSeccomp: poolFilter, cg: cg, cgIdle: cg.Idle(), log: log,
		spawner: launch.NewSpawner(cfg.InitPath, log), stub: stub}, nil
}

// findStub returns the stub binary's path when cfg asks for the stub, else "".
func findStub(cfg Config) (string, error) {
	if !cfg.Stub {
		return "", nil
	}
	path := filepath.Join(filepath.Dir(cfg.InitPath), "corral-initstub")
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("container backend: the init stub (build it with make build): %w", err)
	}
	return path, nil
}

// Close stops the backend's spawner; its sandboxes keep running.
func (b *Backend) Close() error { return b.spawner.Close() }

func compile(p *seccomp.Profile) ([]byte, error) {
	prog, err := seccomp.Compile(p)
	if err != nil {
		return nil, fmt.Errorf("container backend: %w", err)
	}
	return seccomp.Encode(prog), nil
}

// RemoveCgroupParent removes the backend's (empty) cgroup parent in every
// hierarchy, for a node that shuts down with every sandbox deleted.
func (b *Backend) RemoveCgroupParent() error {
	if err := errors.Join(b.cg.RemoveParent(), b.cgIdle.RemoveParent()); err != nil {
		return fmt.Errorf("container backend: remove cgroup parent %s: %w", b.cfg.CgroupParent, err)
	}
	return nil
}

// group returns sandbox id's cgroup, under the best-effort parent if it
// is there.
func (b *Backend) group(id string) *cgroup.Group {
	if g := b.cgIdle.Group(id); g.Exists() {
		return g
	}
	return b.cg.Group(id)
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "container" }

// record is what the node persists for Recover and Cleanup.
type record struct {
	Pid       int               `json:"pid"`
	StartTime uint64            `json:"start_time"`
	Net       *netpolicy.Record `json:"net,omitempty"`
	IDs       userns.Range      `json:"ids"`
	// View is what a recyclable sandbox's next view is made of.
	View *viewRecord `json:"view,omitempty"`
	// InitServes says PID 1 is corral-init's server for the sandbox's life
	// (not the stub, whose server lingers and exits), so exec connections
	// are kept (launch.Client.ReuseConns). Records older than it lack it:
	// their sandboxes may run the stub, so their connections are not kept.
	InitServes bool `json:"init_serves,omitempty"`
}

// viewRecord is a recyclable sandbox's spec as Renew needs it.
type viewRecord struct {
	Layers    []string          `json:"layers"`
	Resources backend.Resources `json:"resources"`
}

func (b *Backend) runDir(id string) string { return filepath.Join(b.cfg.RunDir, id) }

func (b *Backend) sockPath(id string) string { return filepath.Join(b.runDir(id), "ctl.sock") }

// Recover implements backend.Backend.
func (b *Backend) Recover(ctx context.Context, id string, rec []byte) (backend.Sandbox, error) {
	if err := backend.CheckID(id); err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(rec, &r); err != nil || r.Pid <= 0 {
		return nil, errdefs.NotFound("sandbox %s: no usable record", id)
	}
	proc, err := launch.Attach(r.Pid, r.StartTime)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if r.IDs.Size == 0 {
		proc.Release()
		return nil, errdefs.NotFound("sandbox %s: record has no id range (made before user namespaces)", id)
	}
	s := b.newSandbox(id, b.group(id), proc, nil, r.IDs)
	if r.InitServes {
		s.client.ReuseConns()
	}
	if r.View != nil {
		spec := backend.Spec{ID: id, Layers: r.View.Layers, Resources: r.View.Resources, Recyclable: true}
		if err := s.startPool(spec); err != nil {
			proc.Release()
			return nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	if r.Net != nil {
		if b.cfg.Network == nil {
			proc.Release()
			return nil, errdefs.NotSupported("sandbox %s: has a network, and this node has no network manager", id)
		}
		if s.net, err = b.cfg.Network.Recover(ctx, id, s.group.V2Path(), *r.Net); err != nil {
			proc.Release()
			return nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	// A frozen init cannot answer: thaw first (the node pauses the sandbox
	// again when its record says paused).
	if err := s.group.Thaw(ctx); err != nil {
		proc.Release()
		return nil, fmt.Errorf("sandbox %s: thaw for recovery: %w", id, err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.client.Ping(pingCtx); err != nil {
		proc.Release()
		return nil, errdefs.NotFound("sandbox %s: init does not answer: %v", id, err)
	}
	return s, nil
}

// Cleanup implements backend.Backend.
func (b *Backend) Cleanup(ctx context.Context, id string, rec []byte) error {
	if err := backend.CheckID(id); err != nil {
		return err
	}
	var errs []error
	var r record
	if rec != nil && json.Unmarshal(rec, &r) == nil && r.Pid > 0 {
		if proc, err := launch.Attach(r.Pid, r.StartTime); err == nil {
			errs = append(errs, proc.Kill())
			proc.Release()
		}
	}
	g := b.group(id)
	if g.Exists() {
		errs = append(errs, g.Kill(ctx), g.Remove(ctx))
	}
	// The namespace went with the processes, and its veth pair with it;
	// the host end is removed in case anything still held the namespace.
	if r.Net != nil && b.cfg.Network != nil {
		errs = append(errs, b.cfg.Network.Remove(*r.Net))
	}
	// The layer before the run dir: if Remove fails (a disk still
	// attached), the run dir keeps the id visible to the next Sweep.
	errs = append(errs, b.cfg.Uppers.Remove(ctx, id))
	// The run dir also outlives a cgroup that could not be removed: it is
	// how the next Sweep knows that cgroup is this daemon's.
	if errs[len(errs)-1] == nil && !g.Exists() {
		errs = append(errs, b.removeRunDir(id))
	}
	// Last: the range may go to a new sandbox only once no process of
	// this one is left.
	if !g.Exists() {
		errs = append(errs, b.cfg.IDRanges.Release(id))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox %s: cleanup: %w", id, err)
	}
	return nil
}

// removeRunDir removes the known files one by one (never RemoveAll: the
// rootfs and disk directories are mount points inside the sandbox and must
// never be walked from here).
func (b *Backend) removeRunDir(id string) error {
	dir := b.runDir(id)
	for _, name := range []string{"ctl.sock", "init.log", "resolv.conf", "rootfs", "disk"} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("remove run dir: %w", err)
		}
	}
	if err := os.Remove(dir); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove run dir: %w", err)
	}
	return nil
}

// Sweep implements backend.Backend. Its candidates are what this daemon
// made: run dirs (made before the cgroup and removed after it), writable
// layers and id ranges. A cgroup under the parent with none of them is
// not this daemon's (a dead daemon's whose parent it took over) and is
// left alone.
func (b *Backend) Sweep(ctx context.Context, keep func(id string) bool) error {
	var ids []string
	ents, err := os.ReadDir(b.cfg.RunDir)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("sweep: %w", err)
	}
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	layers, err := b.cfg.Uppers.IDs()
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	ids = append(ids, layers...)
	owners, err := b.cfg.IDRanges.Owners()
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	ids = append(ids, owners...)
	seen := map[string]bool{}
	var errs []error
	for _, id := range ids {
		if seen[id] || backend.CheckID(id) != nil || keep(id) {
			continue
		}
		seen[id] = true
		b.log.Info("sweeping leftover sandbox", "sandbox", id)
		errs = append(errs, b.Cleanup(ctx, id, nil))
	}
	b.logForeignCgroups(ids)
	return errors.Join(append(errs, b.sweepNetwork())...)
}

// logForeignCgroups says how many cgroups under the parents are not this
// daemon's (none of ours names them), once per sweep.
func (b *Backend) logForeignCgroups(ours []string) {
	mine := map[string]bool{}
	for _, id := range ours {
		mine[id] = true
	}
	var foreign []string
	for _, m := range []*cgroup.Manager{b.cg, b.cgIdle} {
		ids, err := m.List()
		if err != nil {
			b.log.Warn("sweep: list cgroups", "err", err)
			continue
		}
		for _, id := range ids {
			if !mine[id] {
				foreign = append(foreign, id)
			}
		}
	}
	if len(foreign) > 0 {
		b.log.Warn("sweep: cgroups this daemon did not create are left alone", "parent", b.cfg.CgroupParent,
			"count", len(foreign), "first", foreign[0])
	}
}

func (b *Backend) sweepNetwork() error {
	if b.cfg.Network == nil {
		return nil
	}
	// Veths of live and pooled sandboxes are known to the manager.
	return b.cfg.Network.Sweep(func(string) bool { return false })
}
