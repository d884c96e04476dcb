package container

import (
	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/upper"
)

var _ backend.LimitEnforcer = (*Backend)(nil)

// Enforces implements backend.LimitEnforcer: CPU and pids limits hold
// where the host has those cgroup controllers (a group is made without the
// ones it lacks), the disk limit where the writable-layer store has quota.
func (b *Backend) Enforces(l backend.Limit) error {
	h := b.cg.Hierarchies()
	switch l {
	case backend.LimitCPU:
		if !h.Has("cpu") {
			return errdefs.NotSupported("%s: this host has no cpu cgroup controller", l)
		}
	case backend.LimitPids:
		if !h.Has("pids") {
			return errdefs.NotSupported("%s: this host has no pids cgroup controller", l)
		}
	case backend.LimitDisk:
		if _, ok := b.cfg.Uppers.(upper.DirStore); ok {
			return errdefs.NotSupported("%s: the writable-layer store is plain directories (upper.DirStore), without quota", l)
		}
	default:
		return errdefs.NotSupported("%s: not a limit of the container backend", l)
	}
	return nil
}
