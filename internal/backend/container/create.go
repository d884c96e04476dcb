package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/initproto"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/runtime/launch"
	"github.com/corral-dev/corral/internal/runtime/userns"
	"github.com/corral-dev/corral/internal/storage/upper"
)

// creation carries the state shared by the create steps.
type creation struct {
	b      *Backend
	spec   backend.Spec
	dir    string
	group  *cgroup.Group
	layer  upper.Layer
	ln     *os.File
	proc   *launch.Process
	net    *netpolicy.Sandbox
	setup  *initproto.Conn
	ids    userns.Range
	mounts []*os.File // for init: the root overlay, or a pool's layers
	undo   backend.Undo
}

// createSteps are the steps of Create, in order; each pushes its own undo.
var createSteps = []backend.Step[*creation]{
	{Name: "rundir", Run: (*creation).makeRunDir},
	{Name: "cgroup", Run: (*creation).makeCgroup},
	{Name: "network", Run: (*creation).makeNetwork},
	{Name: "upper", Run: (*creation).makeUpper},
	{Name: "io", Run: (*creation).limitIO},
	{Name: "ids", Run: (*creation).allocateIDs},
	{Name: "socket", Run: (*creation).makeSocket},
	{Name: "spawn", Run: (*creation).spawn},
	{Name: "mounts", Run: (*creation).makeMounts},
	{Name: "ready", Run: (*creation).waitReady},
}

// defaultViewBytes is the writable tmpfs of a resettable sandbox without a
// disk limit.
const defaultViewBytes = 64 << 20

// failStep makes Create, or a recyclable sandbox's Renew, fail at the named
// step (tests only).
var failStep string

// Create implements backend.Backend.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) (backend.Sandbox, error) {
	if err := backend.CheckID(spec.ID); err != nil {
		return nil, err
	}
	if len(spec.Layers) == 0 {
		return nil, errdefs.InvalidArgument("sandbox %s: layers: at least one is required", spec.ID)
	}
	if spec.Resettable && spec.Recyclable {
		return nil, errdefs.InvalidArgument("sandbox %s: a sandbox is resettable (fncall) or recyclable, not both", spec.ID)
	}
	c := &creation{b: b, spec: spec, dir: b.runDir(spec.ID)}
	timings, err := backend.RunSteps(ctx, c, createSteps, &c.undo, failStep)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	s := b.newSandbox(spec.ID, c.group, c.proc, c.net, c.ids)
	if b.stub == "" {
		// corral-init's server is PID 1 for the sandbox's life (a stub's
		// server lingers and goes).
		s.client.ReuseConns()
	}
	if spec.Resettable || spec.Recyclable {
		if err := s.startPool(spec); err != nil {
			c.undo.Run()
			return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	b.log.Debug("sandbox created", append([]any{"sandbox", spec.ID, "pid", c.proc.Pid}, timings...)...)
	return s, nil
}

func (c *creation) makeRunDir(ctx context.Context) error {
	if err := os.Mkdir(c.dir, 0o700); err != nil {
		if os.IsExist(err) {
			return errdefs.AlreadyExists("run dir %s exists", c.dir)
		}
		return err
	}
	c.undo.Push(func() { _ = c.b.removeRunDir(c.spec.ID) })
	for _, name := range []string{"rootfs", "disk"} {
		if err := os.Mkdir(filepath.Join(c.dir, name), 0o755); err != nil {
			return err
		}
	}
	return nil
}

func (c *creation) makeCgroup(ctx context.Context) error {
	r := c.spec.Resources
	mgr := c.b.cg
	if r.BestEffort {
		mgr = c.b.cgIdle
	}
	g, err := mgr.Create(c.spec.ID, cgroup.Limits{MemoryBytes: r.MemoryBytes, CPUMillis: r.CPUMillis, Pids: r.Pids})
	if errors.Is(err, cgroup.ErrNoIdle) {
		err = errdefs.NotSupported("resources.best_effort: %v", err)
	}
	if g != nil {
		c.undo.Push(func() {
			ctx := context.WithoutCancel(ctx)
			_ = g.Kill(ctx)
			_ = g.Remove(ctx)
		})
	}
	c.group = g
	return err
}

// makeNetwork takes a wired namespace from the pool and attaches the
// policy's programs to the sandbox's cgroup before anything runs in it.
func (c *creation) makeNetwork(ctx context.Context) error {
	mode, err := netpolicy.ParseMode(c.spec.Network.Mode)
	if err != nil {
		return err
	}
	if mode == netpolicy.ModeNone {
		return nil
	}
	if c.b.cfg.Network == nil {
		return errdefs.NotSupported("network.mode: %s needs the node's network manager (this node runs without one)", mode)
	}
	if c.spec.Resettable || c.spec.Recyclable {
		return errdefs.NotSupported("network.mode: %s is not available to resettable (fncall) or recyclable sandboxes", mode)
	}
	n, err := c.b.cfg.Network.Attach(ctx, c.spec.ID, c.group.V2Path(), netpolicy.Policy{Mode: mode, Allow: c.spec.Network.Allow})
	if err != nil {
		return err
	}
	c.net = n
	c.undo.Push(func() { _ = n.Close() })
	resolv := fmt.Sprintf("nameserver %s\noptions timeout:2 attempts:2\n", n.Resolver())
	return os.WriteFile(filepath.Join(c.dir, "resolv.conf"), []byte(resolv), 0o644)
}

func (c *creation) makeUpper(ctx context.Context) error {
	if c.spec.Resettable {
		return nil // a tmpfs inside the sandbox
	}
	r := c.spec.Resources
	layer, err := c.b.cfg.Uppers.Create(ctx, c.spec.ID, r.DiskBytes, r.DiskInodes)
	if err != nil {
		return err
	}
	c.layer = layer
	// Runs after the spawn step's undo has killed init: the device is
	// then unmounted and Remove finds it detached.
	c.undo.Push(func() {
		_ = c.layer.Close()
		_ = c.b.cfg.Uppers.Remove(context.WithoutCancel(ctx), c.spec.ID)
	})
	return nil
}

// allocateIDs takes the sandbox's host id range from the node-wide
// allocator; it goes back once init (spawned after this) is dead.
func (c *creation) allocateIDs(ctx context.Context) error {
	ids, err := c.b.cfg.IDRanges.Allocate(c.spec.ID)
	if err != nil {
		return err
	}
	c.ids = ids
	c.undo.Push(func() { _ = c.b.cfg.IDRanges.Release(c.spec.ID) })
	return nil
}

func (c *creation) makeSocket(ctx context.Context) error {
	ln, err := launch.Listen(c.b.sockPath(c.spec.ID))
	if err != nil {
		return err
	}
	c.ln = ln
	// The node never keeps the listener: init owns it after spawn.
	c.undo.Push(func() {
		if c.ln != nil {
			c.ln.Close()
		}
	})
	return nil
}

func (c *creation) spawn(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(c.dir, "init.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	sc := launch.SpawnConfig{
		InitPath: c.b.cfg.InitPath, Group: c.group, Listener: c.ln, Stderr: logf,
		Dir: filepath.Join(c.dir, "rootfs"), IDs: c.ids, Spawner: c.b.spawner,
	}
	if c.net != nil {
		sc.Netns = c.net.Netns()
	}
	proc, setup, err := launch.Spawn(sc)
	c.ln.Close()
	c.ln = nil
	if err != nil {
		return err
	}
	c.proc, c.setup = proc, setup
	c.undo.Push(func() {
		_ = proc.Kill()
		<-proc.Done()
		proc.Release()
	})
	return nil
}

// waitReady sends init its config with the mounts and waits for ready.
// The node's fds on the mounts and on a disk device go either way, so that
// from now on only the sandbox's mount namespace holds them.
func (c *creation) waitReady(ctx context.Context) error {
	defer c.layer.Close()
	defer closeAll(c.mounts)
	cfg := initproto.Config{
		Mounts:     len(c.mounts),
		Hostname:   c.spec.Hostname,
		Seccomp:    c.b.seccomp,
		NoSeccomp:  c.b.cfg.NoSeccomp,
		Shell:      c.b.cfg.Shell,
		BestEffort: c.spec.Resources.BestEffort,
	}
	cfg.ResolvConf = c.net != nil && !c.spec.Resettable
	cfg.Sysfs = cfg.ResolvConf
	if c.spec.Resettable {
		cfg.Pool, cfg.ViewBytes = true, c.spec.Resources.DiskBytes
		if cfg.ViewBytes <= 0 {
			cfg.ViewBytes = defaultViewBytes
		}
	}
	if c.spec.Recyclable {
		cfg.Pool, cfg.View = true, true
	}
	if cfg.Pool {
		if !cfg.NoSeccomp {
			cfg.Seccomp, cfg.PoolSeccomp = c.b.poolSeccomp, c.b.seccomp
		}
	}
	fds := make([]int, len(c.mounts), len(c.mounts)+1)
	for i, m := range c.mounts {
		fds[i] = int(m.Fd())
	}
	if c.b.stub != "" && !cfg.Pool {
		stub, err := os.Open(c.b.stub)
		if err != nil {
			return fmt.Errorf("open corral-initstub: %w", err)
		}
		defer stub.Close()
		cfg.Stub = true
		fds = append(fds, int(stub.Fd()))
	}
	return c.proc.Setup(ctx, c.setup, cfg, fds...)
}
