package microvm

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

var _ backend.LimitEnforcer = (*Backend)(nil)

// Enforces implements backend.LimitEnforcer. CPU: the VMM's host cgroup
// has a CFS quota of cpu_millis (vCPUs are whole cores, so the quota is
// what holds a fraction). Pids: the guest's corral-agent starts commands
// in a guest cgroup with that pids.max (agentproto.OpLimits). Disk: the
// writable layer is an ext4 file system of disk_bytes, full at the limit.
func (b *Backend) Enforces(l backend.Limit) error {
	switch l {
	case backend.LimitCPU:
		return b.cpu.Enforces()
	case backend.LimitPids, backend.LimitDisk:
	default:
		return errdefs.NotSupported("%s: not a limit of the microvm backend", l)
	}
	return nil
}

// guestLimits sends the agent the sandbox's pids limit when the guest
// holds another: had, none at boot, the snapshot's source's on a restore.
// An agent older than the limits op (a snapshot's) refuses it with a
// not-supported error.
func (s *sandbox) guestLimits(ctx context.Context, had int64) error {
	if s.m.Pids == had {
		return nil
	}
	if _, err := s.agent.Call(ctx, agentproto.Request{Op: agentproto.OpLimits, Limits: &agentproto.Limits{Pids: s.m.Pids}}); err != nil {
		return fmt.Errorf("guest limits: %w", err)
	}
	return nil
}
