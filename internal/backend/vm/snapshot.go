package vm

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
	"github.com/corral-dev/corral/internal/netpolicy"
)

// Files of a snapshot dir (SnapshotTo writes them, Restore reads them),
// beside qemuvm.SnapStateFile (the source's machineState) and
// qemuvm.SnapRAMFile (its guest RAM, when not in snapMemFile).
const (
	snapMemFile  = snapshotFile // device state (and RAM without ram.img)
	snapDiskFile = overlayFile  // copy of the overlay; the image stays its backing file
	snapVarsFile = varsFile     // UEFI variables (uefi images)
)

var (
	_ backend.Snapshotter = (*sandbox)(nil)
	_ backend.Restorer    = (*Backend)(nil)
)

// restorable says whether a guest can take a new sandbox's identity:
// corral-agent takes a new secret and hostname (identity op), a Linux
// guest's shell new addresses; a guest with qemu-ga only and no POSIX
// shell (Windows) can be told none of it.
func restorable(ms machineState) error {
	if !ms.Agent && !ms.Linux {
		return errdefs.NotSupported("not supported: snapshot of a %q guest without corral-agent: a restored copy could not take its new sandbox's hostname and addresses (docs/vm.md)", ms.OS)
	}
	return nil
}

// SnapshotTo implements backend.Snapshotter for a running VM: corral-agent
// is told to start a fresh session (a restored copy must not expect this
// session's stream ids; calls in flight on it are cut, which is why the
// node refuses a snapshot while other calls run), then with the vCPUs
// stopped the device state and guest RAM are saved and the overlay (and
// UEFI variables) copied before the VM continues.
func (s *sandbox) SnapshotTo(ctx context.Context, dir string) (int64, error) {
	if err := s.Serving(); err != nil {
		return 0, err
	}
	if err := restorable(s.m.machineState); err != nil {
		return 0, err
	}
	if err := s.WhileRunning(func() error { return qemuvm.WriteState(dir, s.m.machineState) }); err != nil {
		return 0, err
	}
	if s.agent != nil {
		_, err := s.agent.Call(ctx, agentproto.Request{Op: agentproto.OpDetach})
		s.agent.close()
		if err != nil {
			return 0, fmt.Errorf("sandbox %s: snapshot: detach corral-agent: %w", s.m.id, err)
		}
	}
	err := s.WhileRunning(func() error { return s.saveLive(ctx, dir) })
	if s.agent != nil {
		// The agent's old session may still write its last frames into
		// the next connection: a fresh session is proven with a ping.
		if werr := s.waitCorralAgent(ctx, time.Minute); err == nil && werr != nil {
			err = fmt.Errorf("sandbox %s: snapshot: corral-agent after the snapshot: %w", s.m.id, werr)
		}
	}
	if err != nil {
		return 0, err
	}
	return qemuvm.DiskUsage(dir)
}

// saveLive saves the running VM into dir (under the Lifecycle's lock).
func (s *sandbox) saveLive(ctx context.Context, dir string) error {
	qc, err := dialQMP(ctx, s.m, nil)
	if err != nil {
		return err
	}
	defer qc.Close()
	return qemuvm.SaveLive(ctx, qc, s.m.Pid, filepath.Join(dir, snapMemFile), filepath.Join(dir, qemuvm.SnapRAMFile), func() error {
		if err := qemuvm.CopyDisk(ctx, s.m.path(overlayFile), filepath.Join(dir, snapDiskFile)); err != nil {
			return err
		}
		if s.m.Firmware == FirmwareUEFI {
			return qemuvm.CopyDisk(ctx, s.m.path(varsFile), filepath.Join(dir, snapVarsFile))
		}
		return nil
	})
}

// Restore implements backend.Restorer: a new run dir with a copy of the
// snapshot's overlay (its backing file is still the image, so a restore
// needs the image and nothing of the snapshot once made: a fork's
// snapshot goes right after), its own network slot and agent secret, QEMU
// started from the snapshot's device state with its RAM image mapped
// copy-on-write (restores of one snapshot share its unwritten pages),
// then the new identity: corral-agent, reached with the snapshot's
// secret, takes the new secret and hostname (identity op); qemu-ga has no
// secret (its socket is the run dir's) and the hostname is set through
// it; a networked guest's NIC takes the new slot's MAC and addresses.
func (b *Backend) Restore(ctx context.Context, spec backend.Spec, dir string) (backend.Sandbox, error) {
	c, err := b.validate(spec)
	if err != nil {
		return nil, err
	}
	var src machineState
	if err := qemuvm.ReadState(dir, &src); err != nil {
		return nil, err
	}
	snap := filepath.Base(dir)
	switch {
	case src.KVM != b.kvm:
		return nil, errdefs.FailedPrecondition("snapshot %s: taken with kvm %v, this node runs kvm %v", snap, src.KVM, b.kvm)
	case src.VCPUs != c.m.VCPUs || src.MemoryMiB != c.m.MemoryMiB:
		return nil, errdefs.InvalidArgument("resources: a restore keeps the snapshot's %d vCPUs and %d MiB", src.VCPUs, src.MemoryMiB)
	case src.Image != c.m.Image:
		return nil, errdefs.InvalidArgument("image: snapshot %s is of VM image %s, not %s", snap, src.Image, c.m.Image)
	case (src.Net != nil) != (c.netOn != netpolicy.ModeNone):
		return nil, errdefs.InvalidArgument("network.mode: a restore keeps the snapshot's NIC (networked: %v); %s does not match", src.Net != nil, c.netOn)
	}
	if err := restorable(src); err != nil {
		return nil, err
	}
	// The guest's firmware, kernel and agent are the snapshot's.
	ms := &c.m.machineState
	ms.Firmware, ms.Kernel, ms.Initrd, ms.Cmdline = src.Firmware, src.Kernel, src.Initrd, src.Cmdline
	ms.OS, ms.Linux, ms.Agent, ms.PortHandshake = src.OS, src.Linux, src.Agent, src.PortHandshake
	timings, err := backend.RunSteps(ctx, c, restoreSteps(dir, src), &c.undo, b.failAt)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: restore: %w", spec.ID, err)
	}
	b.log.Debug("vm restored", append([]any{"sandbox", spec.ID, "snapshot", snap}, timings...)...)
	return c.s, nil
}

// restoreSteps are Restore in order: Create's steps where they make the
// same thing (run dir, network slot, secret, state, QEMU), the disk from
// the snapshot in place of a new overlay and firmware, and the new
// identity in place of the guest's first setup.
func restoreSteps(dir string, src machineState) []backend.Step[*creation] {
	return []backend.Step[*creation]{
		createStep("run dir"),
		{Name: "disk", Run: func(c *creation, ctx context.Context) error {
			if err := qemuvm.CopyDisk(ctx, filepath.Join(dir, snapDiskFile), c.m.path(overlayFile)); err != nil {
				return err
			}
			if c.m.Firmware == FirmwareUEFI {
				return qemuvm.CopyDisk(ctx, filepath.Join(dir, snapVarsFile), c.m.path(varsFile))
			}
			return nil
		}},
		createStep("network"),
		createStep("agent secret"),
		createStep("state"),
		{Name: "qemu", Run: func(c *creation, ctx context.Context) error {
			c.m.incoming, c.m.ramFile = filepath.Join(dir, snapMemFile), qemuvm.RAMImage(dir)
			// A later resume of this sandbox (after a pause) reads its
			// own run dir, not the snapshot.
			defer func() { c.m.incoming, c.m.ramFile = "", "" }()
			return createStep("qemu").Run(c, ctx)
		}},
		{Name: "guest agent", Run: func(c *creation, ctx context.Context) error {
			c.s = c.b.newSandbox(c.m, c.proc)
			c.undo.Push(func() { c.s.qga.close(); c.s.agent.close() })
			if c.s.agent == nil {
				return c.s.waitAgent(ctx, time.Minute)
			}
			// The restored agent knows only the snapshot's secret.
			c.s.agent.setSecret(src.Secret)
			err := c.s.waitAgent(ctx, time.Minute)
			if err == nil {
				_, err = c.s.agent.Call(ctx, agentproto.Request{Op: agentproto.OpIdentity,
					Identity: &agentproto.Identity{Secret: c.m.Secret, Hostname: c.spec.Hostname}})
			}
			c.s.agent.setSecret(c.m.Secret)
			if err != nil {
				return fmt.Errorf("restored corral-agent: %w", err)
			}
			return nil
		}},
		{Name: "guest setup", Run: func(c *creation, ctx context.Context) error {
			hostname := c.spec.Hostname
			if c.s.agent != nil {
				hostname = "" // the identity op set it
			}
			return c.s.readdressGuest(ctx, hostname, src.MAC)
		}},
	}
}

// createStep is the step of createSteps named name.
func createStep(name string) backend.Step[*creation] {
	for _, st := range createSteps {
		if st.Name == name {
			return st
		}
	}
	panic("vm: no create step " + name)
}

// readdressGuest gives a restored Linux guest its hostname (when set) and,
// when networked, moves the NIC that has the snapshot's MAC oldMAC to the
// new slot: its MAC, addresses, routes and resolver; the snapshot's
// addresses and neighbours (the old slot's) go, and the link goes down
// and up so that its IPv6 link-local address follows the new MAC. One
// shell and one `ip -batch`: every process costs seconds in a loaded TCG
// guest. Other guests are refused before (restorable).
func (s *sandbox) readdressGuest(ctx context.Context, hostname, oldMAC string) error {
	if hostname == "" && s.m.net == nil {
		return nil
	}
	script := `[ -z "$1" ] || hostname "$1" || exit 1
[ -n "$2" ] || exit 0
dev=
for i in /sys/class/net/*; do read -r a < "$i/address" && [ "$a" = "$2" ] && dev=${i##*/}; done
[ -n "$dev" ] || { echo "no NIC with the snapshot's MAC $2" >&2; exit 1; }
ip -batch - <<EOF || exit 1
link set dev $dev down
link set dev $dev address $3
addr flush dev $dev
neigh flush dev $dev
link set dev $dev up
addr add $4 dev $dev
route replace default via $5 dev $dev
addr add $6 dev $dev nodad
route replace default via $7 dev $dev
EOF
echo "nameserver $8" > /etc/resolv.conf`
	args := []string{hostname}
	if s.m.net != nil {
		g := s.m.net.Guest()
		args = append(args, oldMAC, s.m.MAC, g.Addr4.String(), g.Gateway4.String(), g.Addr6.String(), g.Gateway6.String(),
			s.m.net.Resolver().String())
	}
	if _, err := s.sh(ctx, script, args...); err != nil {
		return fmt.Errorf("guest identity: %w", err)
	}
	return nil
}
