// Package microvm is the "microvm" backend: each sandbox is a virtual
// machine with its own guest kernel (Debian's linux-image-amd64), booted
// by QEMU's microvm machine (KVM when /dev/kvm exists, TCG otherwise) or,
// where a firecracker binary and /dev/kvm exist, by Firecracker. The guest's
// PID 1 is corral-agent (internal/guest/agent), from an initramfs the backend
// builds; it mounts the image's EROFS layers (read-only virtio block
// devices) under an overlay whose upper is the sandbox's own ext4 disk,
// and serves exec and file calls (internal/guest/agentproto) over virtio-serial
// or vsock. Everything of a sandbox lives in its run dir <RunDir>/<id>.
//
// It imports backend, backend/qemu, guest/agentclient, guest/agentproto, errdefs,
// netpolicy, qmp and runtime/launch; never the node, control, state or API
// layers, nor the image or blob stores (internal/deptest).
package microvm

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// MinMemoryBytes is the smallest guest RAM: the Debian kernel, the
// initramfs while it is unpacked, and the agent.
const MinMemoryBytes = 128 << 20

// Config configures the backend.
type Config struct {
	// RunDir holds one 0700 directory per sandbox. Required.
	RunDir string
	// AgentPath is the static corral-agent. Default: beside os.Executable().
	AgentPath string
	// Kernel is the guest kernel image; KernelModules its modules dir
	// (/lib/modules/<release>). Default: the newest /boot/vmlinuz-*.
	Kernel        string
	KernelModules string
	// Busybox is a static busybox for shell execs (required).
	Busybox string
	// QEMU is qemu-system-x86_64 (default: from PATH).
	QEMU string
	// Firecracker, when set (or found in PATH) and KVM works, is used
	// instead of QEMU, booting FirecrackerKernel: an uncompressed ELF
	// vmlinux of the same release as Kernel (default: Kernel's path with
	// vmlinuz replaced by vmlinux). Without one QEMU is used.
	Firecracker       string
	FirecrackerKernel string
	// SnapshotAfter: a paused microVM is stopped at once (its RAM stays
	// allocated, resume is instant); once it has been paused this long its
	// memory and device state go to a file and the VMM exits, freeing the
	// memory; resume then restores it. Zero snapshots at pause; negative
	// never snapshots.
	SnapshotAfter time.Duration
	// Network wires sandboxes with a network mode other than none; nil:
	// only mode none.
	Network *netpolicy.Manager
	// CgroupParent is the node's sandbox cgroup parent: each QEMU runs in
	// a group of its own under <CgroupParent>-microvm, whose CPU quota is
	// the sandbox's cpu_millis. Empty: VMMs stay in the daemon's cgroup
	// and CPU limits are not enforced.
	CgroupParent string
	Logger       *slog.Logger
}

// Backend implements backend.Backend.
type Backend struct {
	cfg  Config
	drv  driver
	kvm  bool
	init *initramfs
	cpu  *qemuvm.CPUGroups
	vms  *qemuvm.RunDir
	log  *slog.Logger
}

var _ backend.Backend = (*Backend)(nil)

// KVMAvailable reports whether guests can run on KVM: /dev/kvm opens and
// the CPU exposes hardware virtualization (vmx or svm). A /dev/kvm without
// those flags exists on some hosted machines (this one among them) and
// boots nothing: QEMU fails to set MSRs or hangs.
func KVMAvailable() bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(cpuinfo), "\n") {
		if name, flags, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "flags" {
			for _, f := range strings.Fields(flags) {
				if f == "vmx" || f == "svm" {
					return true
				}
			}
			return false
		}
	}
	return false
}

// New checks the host (QEMU or Firecracker, a guest kernel and its modules,
// the agent) and builds the base initramfs.
func New(cfg Config) (*Backend, error) {
	if cfg.RunDir == "" || cfg.Busybox == "" {
		return nil, errdefs.InvalidArgument("microvm backend: RunDir and Busybox are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var err error
	if cfg.AgentPath, err = backend.SandboxBinary(cfg.AgentPath, "corral-agent", "Config.AgentPath"); err != nil {
		return nil, fmt.Errorf("microvm backend: %w", err)
	}
	if cfg.Kernel == "" {
		k, mods, err := findKernel()
		if err != nil {
			return nil, err
		}
		cfg.Kernel, cfg.KernelModules = k, mods
	}
	b := &Backend{cfg: cfg, kvm: KVMAvailable(), log: cfg.Logger.With("backend", "microvm")}
	if b.cpu, err = qemuvm.NewCPUGroups(cfg.CgroupParent, "microvm"); err != nil {
		return nil, fmt.Errorf("microvm backend: %w", err)
	}
	b.vms = &qemuvm.RunDir{Path: cfg.RunDir, IsVMM: isVMM, Network: cfg.Network, Groups: b.cpu, Log: b.log}
	mods := guestModules
	if fc := cfg.Firecracker; b.kvm {
		if fc == "" {
			fc, _ = exec.LookPath("firecracker")
		}
		kernel := cfg.FirecrackerKernel
		if kernel == "" {
			kernel = strings.Replace(cfg.Kernel, "vmlinuz", "vmlinux", 1)
		}
		switch {
		case fc == "":
		case checkKernel(kernel) != nil:
			b.log.Warn("firecracker found but no uncompressed guest kernel; using QEMU", "err", checkKernel(kernel))
		default:
			b.drv = &firecracker{bin: fc, cpu: b.cpu}
			b.cfg.Kernel = kernel
		}
	}
	if b.drv == nil {
		bin := cfg.QEMU
		if bin == "" {
			var err error
			if bin, err = exec.LookPath("qemu-system-x86_64"); err != nil {
				return nil, errdefs.NotSupported("microvm backend: needs qemu-system-x86_64 (package qemu-system-x86) or firecracker with /dev/kvm")
			}
		}
		b.drv = &qemu{bin: bin, cpu: b.cpu}
	}
	if b.drv.Caps().Vsock {
		mods = append(append([]string(nil), guestModules...), vsockModules...)
	}
	if err := os.MkdirAll(cfg.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("microvm backend: run dir: %w", err)
	}
	cache := filepath.Join(cfg.RunDir, ".initramfs")
	if err := os.MkdirAll(cache, 0o700); err != nil {
		return nil, fmt.Errorf("microvm backend: %w", err)
	}
	ir, err := buildInitramfs(cache, cfg.AgentPath, cfg.Busybox, cfg.KernelModules, mods)
	if err != nil {
		return nil, fmt.Errorf("microvm backend: %w", err)
	}
	b.init = ir
	return b, nil
}

// findKernel returns the newest /boot/vmlinuz-* with its modules dir.
func findKernel() (string, string, error) {
	ks, _ := filepath.Glob("/boot/vmlinuz-*")
	for i := len(ks) - 1; i >= 0; i-- {
		release := strings.TrimPrefix(filepath.Base(ks[i]), "vmlinuz-")
		mods := filepath.Join("/lib/modules", release)
		if _, err := os.Stat(filepath.Join(mods, "modules.dep")); err == nil {
			return ks[i], mods, nil
		}
	}
	return "", "", errdefs.NotSupported("microvm backend: no guest kernel (/boot/vmlinuz-* with /lib/modules; apt-get install linux-image-amd64)")
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "microvm" }

// Driver names the VMM in use ("qemu" or "firecracker") and KVM whether
// guests run on KVM (else TCG emulation).
func (b *Backend) Driver() string { return b.drv.Name() }
func (b *Backend) KVM() bool      { return b.kvm }

func (b *Backend) runDir(id string) string { return b.vms.Dir(id) }

// Create implements backend.Backend: the spec checked against what the
// backend and its driver can do, then the steps of createSteps (run dir,
// network, state, writable disk, initrd with the sandbox's config and
// secret, VMM start, agent handshake), undone in reverse on a failure.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) (backend.Sandbox, error) {
	mode, err := b.checkSpec(spec)
	if err != nil {
		return nil, err
	}
	c := &creation{b: b, spec: spec, mode: mode}
	timings, err := backend.RunSteps(ctx, c, createSteps, &c.undo, failStep)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	b.log.Debug("sandbox created", append([]any{"sandbox", spec.ID, "pid", c.proc.Pid}, timings...)...)
	return c.s, nil
}

// bootTimeout bounds create → agent ready; TCG on shared cores is slow.
func bootTimeout(kvm bool) time.Duration {
	if kvm {
		return 30 * time.Second
	}
	return 3 * time.Minute
}

// makeDisk makes the writable layer: a sparse file of bytes formatted as
// ext4 with at most inodes inodes (its size and inode count are the
// sandbox's disk limits, enforced by the guest kernel).
func makeDisk(ctx context.Context, path string, bytes, inodes int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	err = f.Truncate(bytes)
	f.Close()
	if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	args := []string{"-q", "-F", "-m", "0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", "-O", "^has_journal"}
	if inodes > 0 {
		args = append(args, "-N", strconv.FormatInt(inodes, 10))
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", append(args, path)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("disk: mkfs.ext4: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Recover implements backend.Backend from the run dir's vm.json.
func (b *Backend) Recover(ctx context.Context, id string, _ []byte) (backend.Sandbox, error) {
	m := &machine{id: id, dir: b.runDir(id), kernel: b.cfg.Kernel}
	if err := b.vms.Load(id, &m.machineState); err != nil {
		return nil, err
	}
	return qemuvm.Recover(ctx, b.cfg.Network, id, m.VMM, bootTimeout(m.KVM), func(ns *netpolicy.Sandbox, proc *launch.Process) qemuvm.Reattacher {
		m.net = ns
		return b.newSandbox(m, proc)
	})
}

// Cleanup implements backend.Backend: the VMM, network slot, cgroup and
// run dir go (qemuvm.RunDir.Cleanup).
func (b *Backend) Cleanup(ctx context.Context, id string, _ []byte) error {
	return b.vms.Cleanup(ctx, id)
}

// Sweep implements backend.Backend: VMM processes, cgroups and run dirs
// of sandboxes without a record are removed.
func (b *Backend) Sweep(ctx context.Context, keep func(id string) bool) error {
	return b.vms.Sweep(ctx, keep)
}

func isVMM(argv0 string) bool { return qemuvm.IsQEMU(argv0) || filepath.Base(argv0) == "firecracker" }

// recordOf is the node's opaque record: everything lives in the run dir.
func recordOf(m *machine) []byte {
	b, _ := json.Marshal(map[string]string{"driver": m.Driver})
	return b
}
