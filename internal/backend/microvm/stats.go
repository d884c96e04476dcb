package microvm

import (
	"context"

	"github.com/corral-dev/corral/internal/backend"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
)

var (
	_ backend.StatsReader = (*sandbox)(nil)
	// Checkpointed is the Lifecycle's: no VMM runs while the VM's state
	// is in its snapshot files.
	_ backend.Checkpointer = (*sandbox)(nil)
)

// Stats implements backend.StatsReader from the host side, without asking
// the guest: the VMM's CPU time and resident memory (what the VM costs the
// node, guest RAM it touched included), its one process, and the blocks
// the writable disk image holds. A snapshotted VM has no VMM: zero CPU and
// memory.
func (s *sandbox) Stats(_ context.Context) (backend.Stats, error) {
	return qemuvm.Stats(s.m.id, s.m.path(diskFile), s.Proc())
}
