package vm

import (
	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

var _ backend.LimitEnforcer = (*Backend)(nil)

// Enforces implements backend.LimitEnforcer: the CPU limit is QEMU's, a
// CFS quota of cpu_millis on its host cgroup. Pids and disk are the
// guest's own: its init owns the guest's cgroups (the agent, when there
// is one, is a service under it, and qemu-ga guests have none to ask), and
// disk_bytes is the size of the whole VM disk, the image's system
// included, not a quota on what commands write.
func (b *Backend) Enforces(l backend.Limit) error {
	switch l {
	case backend.LimitCPU:
		return b.cpu.Enforces()
	case backend.LimitPids:
		return errdefs.NotSupported("%s: a full VM's guest init owns its cgroups (corral-agent runs as one of its services, qemu-ga guests have no agent of corral's), so no process count is held", l)
	case backend.LimitDisk:
		return errdefs.NotSupported("%s: it sizes the whole VM disk (the image's system included), not what commands may write", l)
	}
	return errdefs.NotSupported("%s: not a limit of the vm backend", l)
}
