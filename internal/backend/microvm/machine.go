package microvm

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/corral-dev/corral/internal/backend"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// Files of a sandbox's run dir (<RunDir>/<id>, 0700). Nothing of a sandbox
// lives anywhere else, so Cleanup removes the directory and is done.
const (
	consoleFile  = "console.log" // the guest's serial console (kernel, agent)
	diskFile     = "disk.img"    // writable ext4 layer, sparse
	initrdFile   = "initrd"      // per-sandbox initramfs, removed once booted
	snapshotFile = "memory.snap" // memory + device state of a snapshotted VM
	qmpSock      = "qmp.sock"
	agentSock    = "agent.sock" // QEMU: virtio-serial chardev; Firecracker: vsock
	apiSock      = "api.sock"   // Firecracker's REST API
	fcConfigFile = "firecracker.json"
)

// agentPort is the virtio-serial port name (QEMU) and agentVsockPort the
// vsock port (Firecracker) the agent serves on.
const (
	agentPort      = "corral.agent"
	agentVsockPort = 1024
)

// machineState is vm.json (qemuvm.MachineFile): what Recover, Cleanup and Sweep need after a
// daemon restart. It is rewritten whenever the VMM process changes
// (snapshot, restore), which the node's own record does not follow.
type machineState struct {
	Driver string `json:"driver"`
	// VMM: the process, snapshotFile when Snapshotted, the network slot.
	qemuvm.VMM
	Secret    string `json:"secret"`
	VCPUs     int    `json:"vcpus"`
	MemoryMiB int64  `json:"memory_mib"`
	// CPUMillis is the VMM's CPU quota (0: none) and Pids the guest's
	// pids limit of the agent's commands (0: none).
	CPUMillis int64 `json:"cpu_millis,omitempty"`
	Pids      int64 `json:"pids,omitempty"`
	// Layers are the attached layer files, topmost first.
	Layers []backend.LayerDisk `json:"layers"`
	KVM    bool                `json:"kvm"`
	// PortHandshake: the guest's agent takes the port handshake
	// (agentproto.SyncPort) on the QEMU port; a snapshot taken before it
	// restores an agent that does not.
	PortHandshake bool `json:"port_handshake,omitempty"`
}

// machine is one VM's configuration and run dir.
type machine struct {
	id  string
	dir string
	machineState
	kernel string
	net    *netpolicy.Sandbox // the live network slot (nil: none, or after a restart)
	// incoming, when set, is the memory file a restore reads instead of
	// the run dir's snapshotFile (a restore into a new sandbox).
	incoming string
	// ramFile, when set with incoming, is the snapshot's guest RAM image:
	// the restore maps it copy-on-write instead of loading RAM from the
	// stream (which then holds the device state only).
	ramFile string
}

// startCPU is the CPU quota a VMM starts with in its cgroup: a restore's
// at once, none for a boot (which under TCG needs every cycle it gets
// not to time out; Create limits it once the agent answered).
func (m *machine) startCPU(restore bool) int64 {
	if restore {
		return m.CPUMillis
	}
	return 0
}

func (m *machine) path(name string) string { return filepath.Join(m.dir, name) }

// save writes machineState as the run dir's qemuvm.MachineFile.
func (m *machine) save() error { return qemuvm.SaveMachine(m.dir, m.machineState) }

// diskSerial names the virtio-blk serial of layer i's device j (j = 0 the
// EROFS image itself); the agent finds its disks by serial, not by order.
func diskSerial(layer, dev int) string {
	if dev == 0 {
		return fmt.Sprintf("l%d", layer)
	}
	return fmt.Sprintf("l%dd%d", layer, dev)
}

const writableSerial = "disk"

// driver is one virtual machine monitor (QEMU, Firecracker). A driver
// keeps no state of its own: everything of a VM is in its machine and run
// dir, so a restarted daemon can drive a VM an earlier one started.
type driver interface {
	Name() string
	// Caps says what the driver offers; Create and New ask it, never the
	// driver's name.
	Caps() driverCaps
	// Start boots the VM (or restores it from snapshotFile when restore
	// is set) and returns once the VMM runs and the guest is started; the
	// VMM process is m.Pid afterwards.
	Start(ctx context.Context, m *machine, restore bool) (*launch.Process, error)
	// DialAgent opens a byte stream to the guest agent.
	DialAgent(ctx context.Context, m *machine) (net.Conn, error)
	// Pause stops the vCPUs; Resume continues them.
	Pause(ctx context.Context, m *machine) error
	Resume(ctx context.Context, m *machine) error
	// Snapshot saves the paused VM's memory and device state into
	// snapshotFile and ends the VMM process.
	Snapshot(ctx context.Context, m *machine) error
}

// driverCaps are what a VMM driver offers.
type driverCaps struct {
	// Network: it attaches a netpolicy slot's tap to the guest.
	Network bool
	// Vsock: the agent's channel is vsock (guest modules vsockModules);
	// otherwise a virtio-serial port.
	Vsock bool
}

// adopt watches the VMM process p just started (with SysProcAttr.PidFD
// set to pidfd) and records it in m; on failure p is killed and reaped.
func (m *machine) adopt(p *os.Process, pidfd int) (*launch.Process, error) {
	proc, err := qemuvm.Adopt(p, pidfd)
	if err != nil {
		return nil, err
	}
	m.Started(proc)
	return proc, nil
}
