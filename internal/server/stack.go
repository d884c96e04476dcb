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
	"github.com/corral-dev/corral/internal/storage/upper/ext4img"
	"github.com/corral-dev/corral/internal/storage/upper/xfs"
)

// Disk stores (Config.DiskStore): how sandboxes' writable layers get their
// disk limits.
const (
	// DiskStoreAuto uses XFS project quota where the kernel has it, else
	// per-sandbox ext4 images.
	DiskStoreAuto = "auto"
	// DiskStoreXFS is one sparse XFS pool with a project quota per sandbox
	// (internal/storage/upper/xfs).
	DiskStoreXFS = "xfs"
	// DiskStoreExt4Image is one small ext4 image per sandbox, mounted only
	// inside the sandbox (internal/storage/upper/ext4img).
	DiskStoreExt4Image = "ext4-image"
)

// stack is the node-local machinery below the node: the disk store for
// writable layers and the backends built on it.
type stack struct {
	uppers    *xfs.Store // nil unless the XFS store is in use
	container *container.Backend
	network   *netpolicy.Manager
	backends  []backend.Backend
	fullVM    *fullvm.Backend // nil: no vm backend on this host
}

// newStack builds the backends; db (the node's state) persists the
// container sandboxes' host id ranges.
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
	store, pool, err := openDiskStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	ctr, err := container.New(container.Config{
		RunDir:       filepath.Join(cfg.DataDir, "run"),
		CgroupParent: cfg.CgroupParent,
		InitPath:     cfg.InitBinary,
		Uppers:       store,
		FavorDynMods: !cfg.KeepCgroupMountOptions,
		Shell:        shell,
		Network:      network,
		Logger:       cfg.Logger,
		IDRanges:     userns.NewAllocator(db),

		RefusePageCacheProbes: cfg.RefusePageCacheProbes,
	})
	if err != nil {
		if pool != nil {
			pool.Close(ctx, false)
		}
		return nil, err
	}
	st := &stack{uppers: pool, container: ctr, network: network, backends: []backend.Backend{ctr}}
	vm, err := microvm.New(microvm.Config{
		RunDir:        filepath.Join(cfg.DataDir, "vm"),
		AgentPath:     cfg.AgentBinary,
		Busybox:       shell,
		SnapshotAfter: cfg.MicroVMSnapshotAfter,
		Network:       network,
		Logger:        cfg.Logger,
	})
	switch {
	case errdefs.IsNotSupported(err):
		cfg.Logger.Warn("microvm backend unavailable", "err", err)
	case err != nil:
		if pool != nil {
			pool.Close(ctx, false)
		}
		return nil, err
	default:
		cfg.Logger.Info("microvm backend", "vmm", vm.Driver(), "kvm", vm.KVM())
		st.backends = append(st.backends, vm)
	}
	if err := st.addFullVM(cfg, network); err != nil {
		if pool != nil {
			pool.Close(ctx, false)
		}
		return nil, err
	}
	return st, nil
}

// addFullVM adds the vm backend (full virtual machines) when the host has
// QEMU; its VM images live beside the layers.
func (s *stack) addFullVM(cfg Config, network *netpolicy.Manager) error {
	b, err := fullvm.New(fullvm.Config{
		RunDir:   filepath.Join(cfg.DataDir, "vms"),
		ImageDir: filepath.Join(cfg.DataDir, "vm-images"),
		Network:  network,
		Logger:   cfg.Logger,
		// Paused full VMs go to disk on the microVMs' schedule.
		SnapshotAfter: cfg.MicroVMSnapshotAfter,

		// vm-image build installs the microVMs' agent into images.
		AgentPath: cfg.AgentBinary,
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

// openDiskStore opens the store cfg.DiskStore names. With auto, the XFS
// quota store is used when quota.Open succeeds; when it says the host
// cannot (errdefs.NotSupported), the ext4-image store; any other error
// fails startup. pool is the XFS store when that is in use.
func openDiskStore(ctx context.Context, cfg Config) (store container.UpperStore, pool *xfs.Store, err error) {
	dir := filepath.Join(cfg.DataDir, "disk")
	kind := cfg.DiskStore
	switch kind {
	case "", DiskStoreAuto, DiskStoreXFS:
		pool, err := xfs.Open(ctx, xfs.Config{Dir: dir, SizeBytes: cfg.DiskPoolBytes})
		if err == nil {
			cfg.Logger.Info("disk store: xfs project quota", "dir", dir)
			return pool, pool, nil
		}
		if kind == DiskStoreXFS || !errdefs.IsNotSupported(err) {
			return nil, nil, fmt.Errorf("disk store xfs: %w", err)
		}
		cfg.Logger.Info("disk store: ext4 image per sandbox, as xfs project quota is not available", "reason", err.Error())
	case DiskStoreExt4Image:
		cfg.Logger.Info("disk store: ext4 image per sandbox, as configured")
	default:
		return nil, nil, errdefs.InvalidArgument("disk store %q: must be %s, %s or %s", kind, DiskStoreAuto, DiskStoreXFS, DiskStoreExt4Image)
	}
	imgs, err := ext4img.Open(ctx, ext4img.Config{Dir: filepath.Join(dir, "images")})
	if err != nil {
		return nil, nil, fmt.Errorf("disk store ext4-image: %w", err)
	}
	return imgs, nil, nil
}

// close releases the stack. With cleanup (every sandbox is deleted by now)
// it also removes the cgroup parent and detaches the XFS disk pool; the
// ext4-image store holds nothing open.
func (s *stack) close(ctx context.Context, cleanup bool) error {
	// The bridge and NAT stay while sandboxes that outlive the server
	// still use them.
	errs := []error{s.network.Close()}
	if cleanup {
		errs = append(errs, s.container.RemoveCgroupParent())
	}
	if s.uppers != nil {
		errs = append(errs, s.uppers.Close(ctx, cleanup))
	}
	return errors.Join(errs...)
}
