package microvm

import (
	"context"
	"fmt"
	"net"

	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/guest/agentproto"
	"github.com/corral-dev/corral/internal/qmp"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// qemu drives QEMU's "microvm" machine: virtio-mmio devices only, no PCI,
// no firmware beyond qboot. Control is QMP on qmp.sock; the agent talks on
// a virtio-serial port whose chardev is agent.sock.
type qemu struct {
	bin string
	cpu *qemuvm.CPUGroups // the VMMs' cgroups (nil: none)
}

func (q *qemu) Name() string     { return "qemu" }
func (q *qemu) Caps() driverCaps { return driverCaps{Network: true} }

// qemuArgs is the command line of m; restore adds -incoming.
func (q *qemu) args(m *machine, restore bool) []string {
	machineOpts := "microvm,x-option-roms=off,rtc=off"
	// Under TCG the guest cannot calibrate its TSC against the PIT when
	// the host is loaded (and then hangs waiting for timer ticks): it is
	// told the TSC rate (TCG's TSC is the host's) and gets the TSC-deadline
	// APIC timer of "-cpu max", which needs no calibration.
	//
	// The translation cache is capped (QEMU's default is up to 1 GiB per
	// VM, touched as code is translated) and pages are not zeroed at
	// allocation (Debian's default), which touched most of an idle guest's
	// RAM: both cost host memory for every idle VM.
	accel := []string{"-accel", "tcg,thread=multi,tb-size=32", "-cpu", "max"}
	cmdline := "console=ttyS0 quiet loglevel=1 panic=-1 reboot=t rdinit=/init init_on_alloc=0"
	if m.KVM {
		accel = []string{"-accel", "kvm", "-cpu", "host"}
	} else if khz := qemuvm.HostTSCkHz(); khz > 0 {
		cmdline += fmt.Sprintf(" tsc_early_khz=%d tsc=reliable", khz)
	}
	// Guest RAM from a memfd (see qemuvm.RAMObject), or on a restore a
	// private mapping of the snapshot's RAM image.
	machineOpts += ",memory-backend=ram"
	ramFile := ""
	if restore {
		ramFile = m.ramFile
	}
	ram := qemuvm.RAMObject(m.MemoryMiB, ramFile)
	args := []string{q.bin, "-M", machineOpts, "-object", ram}
	args = append(args, accel...)
	args = append(args, qemuvm.SandboxArgs...)
	args = append(args,
		"-name", "corral-"+m.id,
		"-m", fmt.Sprintf("%dM", m.MemoryMiB),
		"-smp", fmt.Sprint(m.VCPUs),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", m.kernel,
		"-initrd", m.path(initrdFile),
		// panic=-1 reboots at once on a guest panic, -no-reboot turns the
		// reboot into QEMU's exit: a crashed guest ends its own VM only.
		"-append", cmdline,
		"-serial", "file:"+m.path(consoleFile),
		"-qmp", "unix:"+m.path(qmpSock)+",server=on,wait=off",
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", "socket,id=agent,path="+qemuvm.Escape(m.path(agentSock))+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name="+agentPort,
		// Free page reporting: the guest hands pages it freed (boot-time
		// buffers, the unpacked initramfs, exited commands) back to the
		// host, so an idle VM holds about what its guest uses.
		"-device", "virtio-balloon-device,free-page-reporting=on",
	)
	for i, l := range m.Layers {
		for j, f := range append([]string{l.Image}, l.Devices...) {
			id := diskSerial(i, j)
			args = append(args,
				"-drive", "id="+id+",file="+qemuvm.Escape(f)+",format=raw,if=none,readonly=on",
				"-device", "virtio-blk-device,drive="+id+",serial="+id)
		}
	}
	args = append(args,
		"-drive", "id=disk,file="+qemuvm.Escape(m.path(diskFile))+",format=raw,if=none,discard=unmap",
		"-device", "virtio-blk-device,drive=disk,serial="+writableSerial)
	if m.net != nil {
		// The tap in the sandbox's network namespace, passed as fd 3.
		args = append(args,
			"-netdev", "tap,id=net0,fd=3",
			"-device", "virtio-net-device,netdev=net0,mac="+m.MAC)
	}
	if restore {
		args = append(args, qemuvm.IncomingArgs...) // loaded by Start
	}
	return args
}

func (q *qemu) Start(ctx context.Context, m *machine, restore bool) (*launch.Process, error) {
	proc, qc, err := qemuvm.Start(ctx, qemuvm.Launch{Args: q.args(m, restore), Dir: m.dir,
		Log: m.path("qemu.log"), QMP: m.path(qmpSock), Net: m.net, CPU: q.cpu, ID: m.id, CPUMillis: m.startCPU(restore)})
	if err != nil {
		return nil, err
	}
	defer qc.Close()
	m.Started(proc)
	if restore {
		if err := qemuvm.Incoming(ctx, qc, m.incomingPath(), m.ramFile != ""); err != nil {
			_ = proc.Kill()
			<-proc.Done()
			return nil, err
		}
	}
	return proc, nil
}

// qmp connects to the VM's QMP socket, failing early if QEMU exits.
func (q *qemu) qmp(ctx context.Context, m *machine, proc *launch.Process) (*qmp.Client, error) {
	return qemuvm.Dial(ctx, m.path(qmpSock), m.path("qemu.log"), proc)
}

func (q *qemu) DialAgent(ctx context.Context, m *machine) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", m.path(agentSock))
	if err != nil {
		return nil, err
	}
	if !m.PortHandshake {
		return conn, nil
	}
	// The port is one byte stream under every connection: the handshake
	// marks where this one's session starts.
	return agentproto.SyncPort(ctx, conn)
}

func (q *qemu) simple(ctx context.Context, m *machine, cmd string) error {
	qc, err := q.qmp(ctx, m, nil)
	if err != nil {
		return err
	}
	defer qc.Close()
	_, err = qc.Run(ctx, cmd, nil)
	return err
}

func (q *qemu) Pause(ctx context.Context, m *machine) error  { return q.simple(ctx, m, "stop") }
func (q *qemu) Resume(ctx context.Context, m *machine) error { return q.simple(ctx, m, "cont") }

// Snapshot saves the VM's RAM and device state to snapshotFile and ends
// QEMU (qemuvm.Hibernate).
func (q *qemu) Snapshot(ctx context.Context, m *machine) error {
	qc, err := q.qmp(ctx, m, nil)
	if err != nil {
		return err
	}
	defer qc.Close()
	return qemuvm.Hibernate(ctx, qc, m.path(snapshotFile))
}

// SnapshotLive implements liveSnapshotter (qemuvm.SaveLive): the VM runs
// on afterwards; whileStopped copies its disk.
func (q *qemu) SnapshotLive(ctx context.Context, m *machine, memPath, ramPath string, whileStopped func() error) error {
	qc, err := q.qmp(ctx, m, nil)
	if err != nil {
		return err
	}
	defer qc.Close()
	return qemuvm.SaveLive(ctx, qc, m.Pid, memPath, ramPath, whileStopped)
}

func (m *machine) incomingPath() string {
	if m.incoming != "" {
		return m.incoming
	}
	return m.path(snapshotFile)
}
