package server

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/backend/container"
	"github.com/corral-dev/corral/internal/backend/microvm"
	fullvm "github.com/corral-dev/corral/internal/backend/vm"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/userns"
	"github.com/corral-dev/corral/internal/state"
	"github.com/corral-dev/corral/internal/storage/layers"
	"github.com/corral-dev/corral/internal/storage/upper"
	"github.com/corral-dev/corral/internal/storage/upper/open"
)

// Disk stores (Config.DiskStore): how sandboxes' writable layers get their
// disk limits (internal/storage/upper/open says what each is).
const (
	DiskStoreAuto      = open.Auto
	DiskStoreXFS       = open.XFS
	DiskStoreExt4Image = open.Ext4Image
)

// stack is the node-local machinery below the node: the disk store for
// writable layers and the backends built on it.
type stack struct {
	uppers    upper.Store
	container *container.Backend
	network   *netpolicy.Manager
	backends  []backend.Backend
	fullVM    *fullvm.Backend // nil: no vm backend on this host
}

// newStack builds the backends; db (the node's state) persists the
// container sandboxes' host id ranges. A refused build undoes what it set
// up as close does.
func newStack(ctx context.Context, cfg Config, db *state.DB) (*stack, error) {
	shell, err := layers.StaticBusybox()
	if err != nil {
		return nil, fmt.Errorf("the sandboxes' shell: %w", err)
	}
	ncfg := cfg.Network
	if ncfg.Logger == nil {
		ncfg.Logger = cfg.Logger
	}
	network, err := netpolicy.NewManager(ncfg)
	if err != nil {
		return nil, err
	}
	store, err := open.Open(ctx, cfg.DiskStore, open.Config{
		Dir: filepath.Join(cfg.DataDir, "disk"), PoolBytes: cfg.DiskPoolBytes, Logger: cfg.Logger,
	})
	if err != nil {
		network.Close()
		return nil, err
	}
	ctr, err := container.New(container.Config{
		RunDir:       filepath.Join(cfg.DataDir, "run"),
		CgroupParent: cfg.CgroupParent,
		InitPath:     cfg.InitBinary,
		Stub:         cfg.InitStub,
		Uppers:       store,
		FavorDynMods: !cfg.KeepCgroupMountOptions,
		Shell:        shell,
		Network:      network,
		Logger:       cfg.Logger,
		IDRanges:     userns.NewAllocator(db),

		RefusePageCacheProbes: cfg.RefusePageCacheProbes,
	})
	if err != nil {
		network.Close()
		store.Close(ctx, cfg.CleanupOnExit)
		return nil, err
	}
	st := &stack{uppers: store, container: ctr, network: network, backends: []backend.Backend{ctr}}
	vm, err := microvm.New(microvm.Config{
		RunDir:        filepath.Join(cfg.DataDir, "vm"),
		AgentPath:     cfg.AgentBinary,
		Busybox:       shell,
		SnapshotAfter: cfg.MicroVMSnapshotAfter,
		Network:       network,
		CgroupParent:  cgroupParent(cfg),
		Logger:        cfg.Logger,
	})
	switch {
	case errdefs.IsNotSupported(err):
		cfg.Logger.Warn("microvm backend unavailable", "err", err)
	case err != nil:
		st.close(ctx, cfg.CleanupOnExit)
		return nil, err
	default:
		cfg.Logger.Info("microvm backend", "vmm", vm.Driver(), "kvm", vm.KVM())
		st.backends = append(st.backends, vm)
	}
	if err := st.addFullVM(cfg, network); err != nil {
		st.close(ctx, cfg.CleanupOnExit)
		return nil, err
	}
	return st, nil
}

// addFullVM adds the vm backend (full virtual machines) when the host has
// QEMU; its VM images live beside the layers.
func (s *stack) addFullVM(cfg Config, network *netpolicy.Manager) error {
	var caCerts []byte
	if cfg.SandboxCACerts != "" {
		var err error
		if caCerts, err = readCACerts(cfg.SandboxCACerts); err != nil {
			return err
		}
	}
	b, err := fullvm.New(fullvm.Config{
		RunDir:   filepath.Join(cfg.DataDir, "vms"),
		ImageDir: filepath.Join(cfg.DataDir, "vm-images"),
		Network:  network,
		Logger:   cfg.Logger,
		// Paused full VMs go to disk on the microVMs' schedule.
		SnapshotAfter: cfg.MicroVMSnapshotAfter,

		// vm-image build installs the microVMs' agent into images.
		AgentPath: cfg.AgentBinary,
		// Full VMs boot their own disk, not layers: the node's CA
		// certificates go into the guest's trust store at boot.
		CACerts: caCerts,
		// QEMU's CPU quota: its cgroup beside the containers'.
		CgroupParent: cgroupParent(cfg),
	})
	switch {
	case errdefs.IsNotSupported(err):
		cfg.Logger.Warn("vm backend unavailable", "err", err)
		return nil
	case err != nil:
		return err
	}
	cfg.Logger.Info("vm backend", "kvm", b.KVM())
	s.fullVM = b
	s.backends = append(s.backends, b)
	return nil
}

// close releases the stack. With cleanup (every sandbox is deleted by now)
// it also removes the cgroup parent and what the disk store set up on the
// host (the XFS pool's mount).
func (s *stack) close(ctx context.Context, cleanup bool) error {
	// The bridge and NAT stay while sandboxes that outlive the server
	// still use them.
	errs := []error{s.network.Close(), s.container.Close()}
	if cleanup {
		errs = append(errs, s.container.RemoveCgroupParent())
	}
	errs = append(errs, s.uppers.Close(ctx, cleanup))
	return errors.Join(errs...)
}
