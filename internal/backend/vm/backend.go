// Package vm is the "vm" backend: each sandbox is a full virtual machine
// (QEMU q35; KVM when usable, TCG otherwise) booting a VM image of any
// operating system from a per-sandbox qcow2 overlay. Exec and files go
// through corral-agent when the image carries it (agent.go: streamed, the
// microVM agent's protocol), else through the QEMU guest agent protocol
// (qemu-ga, which Linux and the virtio-win Windows agent both speak), the
// screen through QMP screendump
// and the keyboard and mouse through QMP input-send-event. The package
// also owns the node's VM image store (import, build, list, remove).
//
// It imports backend, backend/qemu, errdefs, guest/agentclient, guest/agentproto,
// netpolicy, qmp and runtime/launch; never the node, control, state or API layers.
package vm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// MinMemoryBytes is the smallest guest RAM: a systemd Debian boots in it.
const MinMemoryBytes = 256 << 20

// Config configures the backend.
type Config struct {
	// RunDir holds one 0700 directory per sandbox; ImageDir the VM
	// images. Both required.
	RunDir   string
	ImageDir string
	// QEMU is qemu-system-x86_64 (default: from PATH).
	QEMU string
	// AgentPath is the static corral-agent that `vm-image build` installs
	// into images (default: beside os.Executable()).
	AgentPath string
	// Network wires sandboxes with a network mode other than none; nil:
	// only mode none.
	Network *netpolicy.Manager
	Logger  *slog.Logger
	// BootTimeout bounds create → guest agent ready (default 30 s on KVM,
	// 5 min under TCG).
	BootTimeout time.Duration
	// SnapshotAfter: a paused VM is stopped at once (its RAM stays
	// allocated); once it has been paused this long its memory and device
	// state go to a file and QEMU exits; resume restores it. Zero
	// snapshots at pause; negative never.
	SnapshotAfter time.Duration
	// CACerts are PEM certificates Linux guests trust besides their
	// image's (the node's --sandbox-ca-certs; see installCACerts).
	CACerts []byte
	// CgroupParent is the node's sandbox cgroup parent: each QEMU runs in
	// a group of its own under <CgroupParent>-vm, whose CPU quota is the
	// sandbox's cpu_millis. Empty: QEMU stays in the daemon's cgroup and
	// CPU limits are not enforced.
	CgroupParent string
}

// Backend implements backend.Backend.
type Backend struct {
	cfg    Config
	qemu   string
	kvm    bool
	images *Images
	cpu    *qemuvm.CPUGroups
	vms    *qemuvm.RunDir
	log    *slog.Logger
	// failAt, in tests, fails Create at the named step.
	failAt string
}

var (
	_ backend.Backend      = (*Backend)(nil)
	_ backend.ImageOwner   = (*Backend)(nil)
	_ backend.Screener     = (*sandbox)(nil)
	_ backend.Networker    = (*sandbox)(nil)
	_ backend.StatsReader  = (*sandbox)(nil)
	_ backend.Checkpointer = (*sandbox)(nil)
)

// New checks the host (QEMU, qemu-img) and opens the image store.
func New(cfg Config) (*Backend, error) {
	if cfg.RunDir == "" || cfg.ImageDir == "" {
		return nil, errdefs.InvalidArgument("vm backend: RunDir and ImageDir are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	bin := cfg.QEMU
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("qemu-system-x86_64"); err != nil {
			return nil, errdefs.NotSupported("vm backend: needs qemu-system-x86_64 (package qemu-system-x86)")
		}
	}
	if _, err := exec.LookPath("qemu-img"); err != nil {
		return nil, errdefs.NotSupported("vm backend: needs qemu-img (package qemu-utils)")
	}
	if err := os.MkdirAll(cfg.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("vm backend: run dir: %w", err)
	}
	b := &Backend{cfg: cfg, qemu: bin, kvm: kvmAvailable(), log: cfg.Logger.With("backend", "vm")}
	var err error
	if b.cpu, err = qemuvm.NewCPUGroups(cfg.CgroupParent, "vm"); err != nil {
		return nil, fmt.Errorf("vm backend: %w", err)
	}
	b.vms = &qemuvm.RunDir{Path: cfg.RunDir, IsVMM: qemuvm.IsQEMU, Network: cfg.Network, Groups: b.cpu, Log: b.log}
	imgs, err := openImages(cfg.ImageDir, b.usersOf)
	if err != nil {
		return nil, err
	}
	imgs.agentPath = cfg.AgentPath
	b.images = imgs
	return b, nil
}

// kvmAvailable: /dev/kvm opens and the CPU has vmx or svm (a /dev/kvm
// without them boots nothing; see microvm.KVMAvailable).
func kvmAvailable() bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	cpuinfo, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(cpuinfo), "\n") {
		if name, flags, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "flags" {
			return strings.Contains(" "+flags+" ", " vmx ") || strings.Contains(" "+flags+" ", " svm ")
		}
	}
	return false
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "vm" }

// KVM reports whether guests run on KVM (else TCG emulation).
func (b *Backend) KVM() bool { return b.kvm }

// Images is the node's VM image store.
func (b *Backend) Images() *Images { return b.images }

// OwnsImages implements backend.ImageOwner: Spec.Image names a VM image
// of this backend's store, not a layer composition.
func (b *Backend) OwnsImages() {}

func (b *Backend) runDir(id string) string { return b.vms.Dir(id) }

func (b *Backend) bootTimeout() time.Duration {
	switch {
	case b.cfg.BootTimeout > 0:
		return b.cfg.BootTimeout
	case b.kvm:
		return 30 * time.Second
	}
	return 5 * time.Minute
}

// usersOf lists the sandboxes whose overlays are backed by image ref.
func (b *Backend) usersOf(ref string) []string {
	ents, _ := os.ReadDir(b.cfg.RunDir)
	var out []string
	for _, e := range ents {
		var st machineState
		if b.vms.Load(e.Name(), &st) == nil && st.Image == ref {
			out = append(out, e.Name())
		}
	}
	return out
}

// creation is what Create's steps share.
type creation struct {
	b     *Backend
	spec  backend.Spec
	img   Image
	m     *machine
	proc  *launch.Process
	s     *sandbox
	netOn netpolicy.Mode
	undo  backend.Undo
}

// undoTimeout bounds the wait for a killed QEMU when a create is undone.
const undoTimeout = time.Minute

// createSteps are Create in order (backend.RunSteps): each pushes the undo
// of what it made; a failure undoes the steps done, in reverse, once, even
// when ctx is cancelled.
var createSteps = []backend.Step[*creation]{
	{Name: "run dir", Run: func(c *creation, _ context.Context) error {
		if err := os.Mkdir(c.m.dir, 0o700); err != nil {
			if errors.Is(err, os.ErrExist) {
				return errdefs.AlreadyExists("sandbox %s: run dir exists", c.spec.ID)
			}
			return fmt.Errorf("run dir: %w", err)
		}
		c.undo.Push(func() { _ = os.RemoveAll(c.m.dir) })
		return nil
	}},
	{Name: "overlay", Run: func(c *creation, ctx context.Context) error {
		// The overlay's virtual size is the disk limit; the image's file
		// system grows into it at boot. It lives in the run dir.
		out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2",
			"-b", c.img.Path(c.img.Disk), "-F", c.img.Format, c.m.path(overlayFile),
			strconv.FormatInt(c.spec.Resources.DiskBytes, 10)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("overlay: qemu-img create: %v: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	}},
	{Name: "firmware", Run: func(c *creation, _ context.Context) error {
		switch c.img.Firmware {
		case FirmwareDirect:
			c.m.Kernel, c.m.Initrd, c.m.Cmdline = c.img.Path(imageKernel), c.img.Path(imageInitrd), c.img.Cmdline
		case FirmwareUEFI:
			// The VM writes its variables: its own copy, not a hard link.
			if err := runCmd(context.Background(), "cp", ovmfVars, c.m.path(varsFile)); err != nil {
				return errdefs.NotSupported("firmware uefi: needs OVMF (apt-get install ovmf): %v", err)
			}
		}
		return nil
	}},
	{Name: "network", Run: func(c *creation, ctx context.Context) error {
		if c.netOn == netpolicy.ModeNone {
			return nil
		}
		ns, err := c.b.cfg.Network.AttachVM(ctx, c.spec.ID, netpolicy.Policy{Mode: c.netOn, Allow: c.spec.Network.Allow})
		if err != nil {
			return err
		}
		c.m.net = ns
		rec := ns.Record()
		c.m.Net, c.m.MAC = &rec, ns.Guest().MAC.String()
		c.undo.Push(func() { _ = ns.Close(); _ = c.b.cfg.Network.Remove(rec) })
		return nil
	}},
	{Name: "agent secret", Run: func(c *creation, _ context.Context) error {
		return writeAgentSecret(c.m) // inside the run dir
	}},
	{Name: "state", Run: func(c *creation, _ context.Context) error {
		return c.m.save()
	}},
	{Name: "qemu", Run: func(c *creation, ctx context.Context) error {
		proc, err := c.b.startQEMU(ctx, c.m)
		if err != nil {
			return err
		}
		c.proc = proc
		c.undo.Push(func() {
			_ = proc.Kill()
			select {
			case <-proc.Done():
				ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
				defer cancel()
				_ = c.b.cpu.Remove(ctx, c.m.id)
			case <-time.After(undoTimeout):
			}
		})
		return c.m.save()
	}},
	{Name: "guest agent", Run: func(c *creation, ctx context.Context) error {
		c.s = c.b.newSandbox(c.m, c.proc)
		c.undo.Push(func() { c.s.qga.close(); c.s.agent.close() })
		return c.s.waitAgent(ctx, c.b.bootTimeout())
	}},
	{Name: "guest setup", Run: func(c *creation, ctx context.Context) error {
		return c.s.setupGuest(ctx, c.spec.Hostname)
	}},
	{Name: "guest CA certs", Run: func(c *creation, ctx context.Context) error {
		return c.s.installCACerts(ctx, c.b.cfg.CACerts)
	}},
	// Only now: a boot under TCG needs every cycle it gets not to time
	// out (a restore is limited from its start).
	{Name: "cpu limit", Run: func(c *creation, _ context.Context) error {
		return c.b.cpu.Limit(c.m.id, c.m.CPUMillis)
	}},
}

// Create implements backend.Backend as createSteps.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) (backend.Sandbox, error) {
	c, err := b.validate(spec)
	if err != nil {
		return nil, err
	}
	timings, err := backend.RunSteps(ctx, c, createSteps, &c.undo, b.failAt)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	b.log.Debug("vm created", append([]any{"sandbox", spec.ID}, timings...)...)
	return c.s, nil
}

// validate checks a spec before anything is made.
func (b *Backend) validate(spec backend.Spec) (*creation, error) {
	if err := backend.CheckID(spec.ID); err != nil {
		return nil, err
	}
	if spec.Resettable {
		return nil, errdefs.NotSupported("vm backend: resettable sandboxes (fncall pools) are container-only")
	}
	mode, err := netpolicy.ParseMode(spec.Network.Mode)
	if err != nil {
		return nil, err
	}
	if mode != netpolicy.ModeNone && b.cfg.Network == nil {
		return nil, errdefs.NotSupported("network.mode: %s needs the node's network manager (this node runs without one)", mode)
	}
	r := spec.Resources
	if r.MemoryBytes < MinMemoryBytes {
		return nil, errdefs.InvalidArgument("resources.memory_bytes: %d is below the vm minimum of %d MiB (guest RAM for its kernel and init)", r.MemoryBytes, MinMemoryBytes>>20)
	}
	if spec.Image == "" {
		return nil, errdefs.InvalidArgument("image: a vm sandbox needs a VM image (corral vm-image ls)")
	}
	img, err := b.images.Get(spec.Image)
	if err != nil {
		return nil, err
	}
	if r.DiskBytes < img.VirtualSize {
		return nil, errdefs.InvalidArgument("resources.disk_bytes: %d is below the size of VM image %s's disk (%d MiB): the overlay cannot be smaller than the disk it covers", r.DiskBytes, img.Ref, (img.VirtualSize+1<<20-1)>>20)
	}
	m := &machine{id: spec.ID, dir: b.runDir(spec.ID), machineState: machineState{
		Image: img.Ref, Firmware: img.Firmware,
		VCPUs:     int(max(1, (r.CPUMillis+999)/1000)),
		MemoryMiB: r.MemoryBytes >> 20,
		CPUMillis: r.CPUMillis,
		KVM:       b.kvm,
		Agent:     img.Agent,

		PortHandshake: img.PortHandshake,
	}}
	return &creation{b: b, spec: spec, img: img, m: m, netOn: mode}, nil
}

// Recover implements backend.Backend from the run dir's vm.json.
func (b *Backend) Recover(ctx context.Context, id string, _ []byte) (backend.Sandbox, error) {
	m := &machine{id: id, dir: b.runDir(id)}
	if err := b.vms.Load(id, &m.machineState); err != nil {
		return nil, err
	}
	return qemuvm.Recover(ctx, b.cfg.Network, id, m.VMM, time.Minute, func(ns *netpolicy.Sandbox, proc *launch.Process) qemuvm.Reattacher {
		m.net = ns
		return b.newSandbox(m, proc)
	})
}

// Cleanup implements backend.Backend: QEMU, the network slot, the cgroup
// and the run dir with the overlay go (qemuvm.RunDir.Cleanup).
func (b *Backend) Cleanup(ctx context.Context, id string, _ []byte) error {
	return b.vms.Cleanup(ctx, id)
}

// Sweep implements backend.Backend: QEMU processes, cgroups and run dirs
// of sandboxes without a record are removed.
func (b *Backend) Sweep(ctx context.Context, keep func(id string) bool) error {
	return b.vms.Sweep(ctx, keep)
}
