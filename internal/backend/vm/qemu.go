package vm

import (
	"context"
	"fmt"
	"strconv"

	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/qmp"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// OVMF firmware files (Debian's ovmf package), for uefi images.
var (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// qemuArgs is the command line of a q35 machine: PCI virtio devices, a
// standard VGA screen (screendump), the PS/2 keyboard of the board and a
// virtio one, a virtio tablet (absolute pointer, so clicks land where
// asked), the guest agent's virtio-serial port, the overlay disk.
func qemuArgs(bin string, m *machine) []string {
	accel := []string{"-accel", "tcg,thread=multi,tb-size=64", "-cpu", "max"}
	if m.KVM {
		accel = []string{"-accel", "kvm", "-cpu", "host"}
	}
	args := []string{bin, "-M", "q35,memory-backend=ram",
		// Guest RAM from a memfd (qemuvm.RAMObject), or on a restore into
		// a new sandbox a private mapping of the snapshot's RAM image.
		"-object", qemuvm.RAMObject(m.MemoryMiB, m.ramFile)}
	args = append(args, accel...)
	args = append(args, qemuvm.SandboxArgs...)
	args = append(args,
		"-name", "corral-"+m.id,
		"-m", fmt.Sprintf("%dM", m.MemoryMiB),
		"-smp", strconv.Itoa(m.VCPUs),
		"-nodefaults", "-no-user-config", "-display", "none",
		// A guest reboot ends QEMU (and the sandbox), as a panic does.
		"-no-reboot",
		"-vga", "std",
		// The screen as VNC on a unix socket in the run dir (no TCP port,
		// nothing the guest can reach): the node's live view relays it.
		"-vnc", "unix:"+qemuvm.Escape(m.path(vncSock))+",share=force-shared",
		"-serial", "file:"+m.path(consoleFile),
		"-qmp", "unix:"+m.path(qmpSock)+",server=on,wait=off",
		"-device", "virtio-serial-pci",
		"-chardev", "socket,id=qga0,path="+qemuvm.Escape(m.path(qgaSock))+",server=on,wait=off",
		"-device", "virtserialport,chardev=qga0,name="+qgaPortName,
		// A virtio keyboard beside the board's PS/2 one: QEMU sends keys
		// to it once the guest drives it, and its queue of 64 events
		// does not drop keys the way PS/2's 16 bytes do when an emulated
		// guest is slow to read them.
		"-device", "virtio-keyboard-pci",
		"-device", "virtio-tablet-pci",
		"-device", "virtio-balloon-pci,free-page-reporting=on",
		"-drive", "id=disk,file="+qemuvm.Escape(m.path(overlayFile))+",format=qcow2,if=none,discard=unmap",
		"-device", "virtio-blk-pci,drive=disk,bootindex=1",
	)
	args = append(args, agentQEMUArgs(m)...)
	switch m.Firmware {
	case FirmwareDirect:
		cmdline := m.Cmdline
		if !m.KVM {
			// TCG guests cannot calibrate their TSC against the PIT on a
			// loaded host: they are told its rate (see microvm).
			if khz := qemuvm.HostTSCkHz(); khz > 0 {
				cmdline += fmt.Sprintf(" tsc_early_khz=%d tsc=reliable", khz)
			}
		}
		args = append(args, "-kernel", m.Kernel, "-initrd", m.Initrd, "-append", cmdline)
	case FirmwareUEFI:
		args = append(args,
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+qemuvm.Escape(ovmfCode),
			"-drive", "if=pflash,format=raw,unit=1,file="+qemuvm.Escape(m.path(varsFile)))
	}
	if m.net != nil {
		// The tap in the sandbox's network namespace, passed as fd 3.
		args = append(args, "-netdev", "tap,id=net0,fd=3", "-device", "virtio-net-pci,netdev=net0,mac="+m.MAC)
	}
	return args
}

// startQEMU starts the VM's QEMU in its own session (it outlives a daemon
// restart) and its cgroup and, when networked, inside the sandbox's
// network namespace with the tap as fd 3; it returns once QMP answers.
// With m.incoming set QEMU loads that migration stream (and m.ramFile,
// when set, as its RAM) and continues, held to its CPU limit from the
// start (a boot is limited by Create's last step).
func (b *Backend) startQEMU(ctx context.Context, m *machine) (*launch.Process, error) {
	args := qemuArgs(b.qemu, m)
	var millis int64
	if m.incoming != "" {
		args = append(args, qemuvm.IncomingArgs...)
		millis = m.CPUMillis
	}
	proc, qc, err := qemuvm.Start(ctx, qemuvm.Launch{Args: args, Dir: m.dir, Log: m.path(logFile), QMP: m.path(qmpSock), Net: m.net,
		CPU: b.cpu, ID: m.id, CPUMillis: millis})
	if err != nil {
		return nil, err
	}
	defer qc.Close()
	m.Started(proc)
	if m.incoming != "" {
		if err := qemuvm.Incoming(ctx, qc, m.incoming, m.ramFile != ""); err != nil {
			_ = proc.Kill()
			<-proc.Done()
			return nil, fmt.Errorf("load snapshot: %w", err)
		}
	}
	return proc, nil
}

// restoreQEMU starts QEMU loading the VM's state from its snapshotFile,
// and records it.
func (b *Backend) restoreQEMU(ctx context.Context, m *machine) (*launch.Process, error) {
	m.incoming = m.path(snapshotFile)
	defer func() { m.incoming = "" }()
	proc, err := b.startQEMU(ctx, m)
	if err != nil {
		return nil, err
	}
	return m.Restored(proc, m.save, m.path(snapshotFile))
}

// saveState streams the stopped VM's RAM and device state to
// snapshotFile, then quits QEMU.
func saveState(ctx context.Context, m *machine) error {
	qc, err := dialQMP(ctx, m, nil)
	if err != nil {
		return err
	}
	defer qc.Close()
	return qemuvm.Hibernate(ctx, qc, m.path(snapshotFile))
}

// dialQMP connects to the VM's QMP socket, failing early if QEMU exits.
func dialQMP(ctx context.Context, m *machine, proc *launch.Process) (*qmp.Client, error) {
	return qemuvm.Dial(ctx, m.path(qmpSock), m.path(logFile), proc)
}

// qmpRun runs one QMP command on a fresh connection.
func qmpRun(ctx context.Context, m *machine, cmd string, args any) ([]byte, error) {
	return qemuvm.Run(ctx, m.path(qmpSock), cmd, args)
}
