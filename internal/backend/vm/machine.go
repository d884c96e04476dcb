package vm

import (
	"path/filepath"

	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/netpolicy"
)

// Files of a sandbox's run dir (<RunDir>/<id>, 0700). Nothing of a sandbox
// lives anywhere else, so Cleanup removes the directory and is done.
const (
	overlayFile  = "disk.qcow2"  // copy-on-write overlay over the image
	varsFile     = "efivars.fd"  // UEFI variables (uefi images)
	consoleFile  = "console.log" // the guest's serial console
	logFile      = "qemu.log"    // QEMU's stderr
	snapshotFile = "memory.snap" // memory + device state of a snapshotted VM
	qmpSock      = "qmp.sock"    // QEMU machine protocol
	qgaSock      = "qga.sock"    // virtio-serial org.qemu.guest_agent.0
	qgaPortName  = "org.qemu.guest_agent.0"
)

// machineState is vm.json (qemuvm.MachineFile): what Recover, Cleanup, Sweep and the image
// store's in-use check need after a daemon restart.
type machineState struct {
	Image     string `json:"image"`
	Firmware  string `json:"firmware"`
	Kernel    string `json:"kernel,omitempty"`
	Initrd    string `json:"initrd,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
	VCPUs     int    `json:"vcpus"`
	MemoryMiB int64  `json:"memory_mib"`
	// CPUMillis is QEMU's CPU quota (0: none).
	CPUMillis int64 `json:"cpu_millis,omitempty"`
	KVM       bool  `json:"kvm"`
	// VMM: QEMU's process, snapshotFile when Snapshotted, the network
	// slot.
	qemuvm.VMM
	// OS is the guest agent's os id ("debian", "mswindows", ...); Linux
	// whether commands may be wrapped by a POSIX shell.
	OS    string `json:"os,omitempty"`
	Linux bool   `json:"linux,omitempty"`
	// Agent: the image runs corral-agent (see agent.go), which takes
	// requests carrying Secret.
	Agent  bool   `json:"agent,omitempty"`
	Secret string `json:"secret,omitempty"`
	// PortHandshake: the agent's connections start with the port
	// handshake (Image.PortHandshake).
	PortHandshake bool `json:"port_handshake,omitempty"`
}

// machine is one VM's configuration and run dir.
type machine struct {
	id  string
	dir string
	machineState
	net *netpolicy.Sandbox // the live network slot (nil: none)
	// incoming, when set, is the migration stream QEMU starts from (a
	// snapshotted VM's own, or a snapshot's on a restore into a new
	// sandbox); ramFile, when set with it, the snapshot's RAM image that
	// QEMU maps copy-on-write instead of reading RAM from the stream.
	incoming, ramFile string
}

func (m *machine) path(name string) string { return filepath.Join(m.dir, name) }

// save writes machineState as the run dir's qemuvm.MachineFile.
func (m *machine) save() error { return qemuvm.SaveMachine(m.dir, m.machineState) }
