package microvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// Files of a snapshot dir (written by SnapshotTo, read by Restore).
// qemuvm.SnapStateFile holds the source's machineState, qemuvm.SnapRAMFile
// its guest RAM when it is not in snapMemFile.
const (
	snapMemFile  = snapshotFile // RAM and device state (QEMU's migration stream)
	snapDiskFile = diskFile     // copy of the writable disk at the same instant
)

// liveSnapshotter is a driver that snapshots a VM without ending it.
type liveSnapshotter interface {
	SnapshotLive(ctx context.Context, m *machine, memPath, ramPath string, whileStopped func() error) error
}

var (
	_ backend.Snapshotter = (*sandbox)(nil)
	_ backend.Restorer    = (*Backend)(nil)
)

// SnapshotTo implements backend.Snapshotter for a running VM: the agent
// is told to start a fresh session (so that a restored copy does not
// expect this session's stream ids; calls in flight on it are cut, which
// is why the node refuses a snapshot while other calls run), then the
// driver saves memory and devices with the vCPUs stopped and the disk is
// copied before they continue.
func (s *sandbox) SnapshotTo(ctx context.Context, dir string) (int64, error) {
	if err := s.Serving(); err != nil {
		return 0, err
	}
	ls, ok := s.b.drv.(liveSnapshotter)
	if !ok {
		return 0, errdefs.NotSupported("not supported: snapshot of a running %s microVM", s.b.drv.Name())
	}
	if err := s.WhileRunning(func() error { return qemuvm.WriteState(dir, s.m.machineState) }); err != nil {
		return 0, err
	}
	_, err := s.agent.Call(ctx, agentproto.Request{Op: agentproto.OpDetach})
	s.dropSession()
	if err != nil {
		return 0, fmt.Errorf("sandbox %s: snapshot: detach agent: %w", s.m.id, err)
	}
	if err := s.WhileRunning(func() error {
		err := ls.SnapshotLive(ctx, s.m, filepath.Join(dir, snapMemFile), filepath.Join(dir, qemuvm.SnapRAMFile), func() error {
			return qemuvm.CopyDisk(ctx, s.m.path(diskFile), filepath.Join(dir, snapDiskFile))
		})
		if err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		return nil
	}); err != nil {
		_ = s.waitAgent(ctx, time.Minute)
		return 0, err
	}
	// The agent's old session may still write its last frames into the
	// next connection: a fresh session is proven with a ping (and made
	// again until one answers) before the sandbox serves calls again.
	if err := s.waitAgent(ctx, time.Minute); err != nil {
		return 0, fmt.Errorf("sandbox %s: snapshot: agent after the snapshot: %w", s.m.id, err)
	}
	return qemuvm.DiskUsage(dir)
}

// Restore implements backend.Restorer: a new run dir (and network slot)
// with a copy of the snapshot's disk, the VMM started from its device
// state with its RAM image mapped copy-on-write (restores of one snapshot
// share its unwritten pages; a restored VM's own snapshots stream RAM
// instead), then the restored agent, reached with the snapshot's secret,
// takes over the new sandbox's secret, hostname and (networked) MAC and
// addresses.
func (b *Backend) Restore(ctx context.Context, spec backend.Spec, dir string) (backend.Sandbox, error) {
	mode, err := b.checkSpec(spec)
	if err != nil {
		return nil, err
	}
	var src machineState
	if err := qemuvm.ReadState(dir, &src); err != nil {
		return nil, err
	}
	vcpus := int(max(1, (spec.Resources.CPUMillis+999)/1000))
	switch {
	case src.Driver != b.drv.Name() || src.KVM != b.kvm:
		return nil, errdefs.FailedPrecondition("snapshot %s: taken with %s (kvm %v), this node runs %s (kvm %v)", filepath.Base(dir), src.Driver, src.KVM, b.drv.Name(), b.kvm)
	case src.VCPUs != vcpus || src.MemoryMiB != spec.Resources.MemoryBytes>>20:
		return nil, errdefs.InvalidArgument("resources: a restore keeps the snapshot's %d vCPUs and %d MiB", src.VCPUs, src.MemoryMiB)
	case !sameLayers(src.Layers, spec.LayerDisks):
		return nil, errdefs.FailedPrecondition("snapshot %s: the image's layer files changed since the snapshot", filepath.Base(dir))
	}
	c := &creation{b: b, spec: spec, mode: mode}
	timings, err := backend.RunSteps(ctx, c, []backend.Step[*creation]{
		{Name: "rundir", Run: (*creation).makeRunDir},
		{Name: "network", Run: (*creation).makeNetwork},
		{Name: "state", Run: (*creation).saveState},
		{Name: "disk", Run: func(c *creation, ctx context.Context) error {
			return qemuvm.CopyDisk(ctx, filepath.Join(dir, snapDiskFile), c.m.path(diskFile))
		}},
		{Name: "vmm", Run: func(c *creation, ctx context.Context) error { return c.startRestored(ctx, dir, src) }},
	}, &c.undo, "")
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: restore: %w", spec.ID, err)
	}
	b.log.Debug("sandbox restored", append([]any{"sandbox", spec.ID, "snapshot", filepath.Base(dir)}, timings...)...)
	return c.s, nil
}

// startRestored starts the VMM from the snapshot's memory and hands the
// restored agent (which still knows only oldSecret) its new identity.
func (c *creation) startRestored(ctx context.Context, dir string, src machineState) error {
	oldSecret := src.Secret
	m := c.m
	m.PortHandshake = src.PortHandshake // the snapshot's agent
	newSecret := m.Secret
	m.incoming = filepath.Join(dir, snapMemFile)
	m.ramFile = qemuvm.RAMImage(dir)
	if err := os.Symlink(c.b.init.path, m.path(initrdFile)); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	defer os.Remove(m.path(initrdFile))
	proc, err := c.b.drv.Start(ctx, m, true)
	// A later restore of this sandbox (after pause --reclaim) reads its
	// own run dir, not the snapshot.
	m.incoming, m.ramFile = "", ""
	if err != nil {
		return fmt.Errorf("start %s: %w", c.b.drv.Name(), err)
	}
	c.proc = proc
	c.undo.Push(func() {
		_ = proc.Kill()
		<-proc.Done()
	})
	if err := m.save(); err != nil {
		return err
	}
	c.s = c.b.newSandbox(m, proc)
	m.Secret = oldSecret
	err = c.s.waitAgent(ctx, time.Minute)
	if err == nil {
		_, err = c.s.agent.Call(ctx, agentproto.Request{Op: agentproto.OpIdentity,
			Identity: &agentproto.Identity{Secret: newSecret, Hostname: c.spec.Hostname, Network: c.fc.Network}})
	}
	m.Secret = newSecret
	if err == nil {
		// A snapshot's older agent has no limits op: the restored guest
		// runs on without its pids limit.
		if err = c.s.guestLimits(ctx, src.Pids); errdefs.IsNotSupported(err) {
			c.b.log.Warn("restored guest's pids limit is not enforced", "sandbox", m.id, "err", err)
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("restored agent: %w", err)
	}
	return m.save()
}
