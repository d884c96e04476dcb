package microvm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// creation carries the state shared by the create steps.
type creation struct {
	b    *Backend
	spec backend.Spec
	mode netpolicy.Mode
	m    *machine
	fc   agentproto.FileConfig // the guest's boot config, written into the initrd
	proc *launch.Process
	s    *sandbox
	undo backend.Undo
}

// createSteps are the steps of Create, in order; each pushes its own undo.
var createSteps = []backend.Step[*creation]{
	{Name: "rundir", Run: (*creation).makeRunDir},
	{Name: "network", Run: (*creation).makeNetwork},
	{Name: "state", Run: (*creation).saveState},
	{Name: "disk", Run: (*creation).makeDisk},
	{Name: "initrd", Run: (*creation).writeInitrd},
	{Name: "vmm", Run: (*creation).startVMM},
	{Name: "agent", Run: (*creation).waitAgent},
}

// failStep makes Create fail at the named step (tests only).
var failStep string

// checkSpec refuses what this backend (and its driver) cannot make, before
// anything is made.
func (b *Backend) checkSpec(spec backend.Spec) (netpolicy.Mode, error) {
	if err := backend.CheckID(spec.ID); err != nil {
		return "", err
	}
	if spec.Resettable {
		return "", errdefs.NotSupported("microvm backend: resettable sandboxes (fncall pools) are container-only")
	}
	mode, err := netpolicy.ParseMode(spec.Network.Mode)
	if err != nil {
		return "", err
	}
	if mode != netpolicy.ModeNone {
		if b.cfg.Network == nil {
			return "", errdefs.NotSupported("network.mode: %s needs the node's network manager (this node runs without one)", mode)
		}
		if !b.drv.Caps().Network {
			return "", errdefs.NotSupported("network.mode: %s is not available with %s microVMs", mode, b.drv.Name())
		}
	}
	if spec.Resources.MemoryBytes < MinMemoryBytes {
		return "", errdefs.InvalidArgument("resources.memory_bytes: %d is below the microvm minimum of %d MiB (the guest kernel's RAM)", spec.Resources.MemoryBytes, MinMemoryBytes>>20)
	}
	if len(spec.LayerDisks) == 0 {
		return "", errdefs.InvalidArgument("microvm backend: the image has no layer files to attach")
	}
	return mode, nil
}

// makeRunDir makes the run dir and the machine with a fresh secret. Its
// undo is a full Cleanup, which also finds a VMM by its command line.
func (c *creation) makeRunDir(ctx context.Context) error {
	dir := c.b.runDir(c.spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return errdefs.AlreadyExists("sandbox %s: run dir exists", c.spec.ID)
		}
		return err
	}
	c.undo.Push(func() { _ = c.b.Cleanup(context.WithoutCancel(ctx), c.spec.ID, nil) })
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return err
	}
	r := c.spec.Resources
	c.m = &machine{id: c.spec.ID, dir: dir, kernel: c.b.cfg.Kernel, machineState: machineState{
		Driver:    c.b.drv.Name(),
		Secret:    hex.EncodeToString(secret),
		VCPUs:     int(max(1, (r.CPUMillis+999)/1000)),
		MemoryMiB: r.MemoryBytes >> 20,
		CPUMillis: r.CPUMillis,
		Pids:      r.Pids,

		PortHandshake: true,
		Layers:        c.spec.LayerDisks,
		KVM:           c.b.kvm,
	}}
	c.fc = agentproto.FileConfig{Secret: c.m.Secret, Hostname: c.spec.Hostname, Disk: writableSerial}
	return nil
}

// makeNetwork wires a networked VM. Guest traffic never meets the cgroup
// programs: the slot's tc program on its veth enforces the same maps.
func (c *creation) makeNetwork(ctx context.Context) error {
	if c.mode == netpolicy.ModeNone {
		return nil
	}
	n, err := c.b.cfg.Network.AttachVM(ctx, c.spec.ID, netpolicy.Policy{Mode: c.mode, Allow: c.spec.Network.Allow})
	if err != nil {
		return err
	}
	c.undo.Push(func() { _ = n.Close() })
	m := c.m
	m.net = n
	rec := n.Record()
	g := n.Guest()
	m.Net, m.MAC = &rec, g.MAC.String()
	c.fc.Network = &agentproto.GuestNetwork{MAC: m.MAC, Addr4: g.Addr4.String(), Addr6: g.Addr6.String(),
		Gateway4: g.Gateway4.String(), Gateway6: g.Gateway6.String(),
		ResolvConf: "nameserver " + n.Resolver().String() + "\n"}
	return nil
}

// saveState writes vm.json, so that Cleanup finds the network slot from
// here on (the run dir's undo removes the file).
func (c *creation) saveState(context.Context) error { return c.m.save() }

func (c *creation) makeDisk(ctx context.Context) error {
	r := c.spec.Resources
	return makeDisk(ctx, c.m.path(diskFile), r.DiskBytes, r.DiskInodes)
}

// writeInitrd writes the guest's boot config, with the secret, into the
// sandbox's initrd: the layer disks by serial and the agent's channel.
func (c *creation) writeInitrd(context.Context) error {
	for i, l := range c.spec.LayerDisks {
		ld := agentproto.LayerDisks{Image: diskSerial(i, 0)}
		for j := range l.Devices {
			ld.Devices = append(ld.Devices, diskSerial(i, j+1))
		}
		c.fc.Layers = append(c.fc.Layers, ld)
	}
	if c.b.drv.Caps().Vsock {
		c.fc.VsockPort = agentVsockPort
	} else {
		c.fc.Port = agentPort
	}
	return c.b.init.writeInitrd(c.m.path(initrdFile), c.fc)
}

// startVMM boots the VM and records the VMM's pid in vm.json.
func (c *creation) startVMM(ctx context.Context) error {
	proc, err := c.b.drv.Start(ctx, c.m, false)
	if err != nil {
		return fmt.Errorf("start %s: %w", c.b.drv.Name(), err)
	}
	c.proc = proc
	c.undo.Push(func() {
		_ = proc.Kill()
		<-proc.Done()
	})
	return c.m.save()
}

// waitAgent waits for the guest agent's first answer, then removes the
// initrd (the VMM has read it into guest memory, and it held the secret;
// a restore loads RAM from the snapshot, not from the initrd) and puts
// the limits in force: the VMM's CPU quota only now, as a boot under TCG
// needs every cycle it gets not to time out.
func (c *creation) waitAgent(ctx context.Context) error {
	c.s = c.b.newSandbox(c.m, c.proc)
	if err := c.s.waitAgent(ctx, bootTimeout(c.b.kvm)); err != nil {
		return err
	}
	_ = os.Remove(c.m.path(initrdFile))
	if err := c.s.guestLimits(ctx, 0); err != nil {
		return err
	}
	return c.b.cpu.Limit(c.m.id, c.m.CPUMillis)
}
