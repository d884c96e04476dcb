package microvm

import (
	"context"
	"fmt"
	"os"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

var _ backend.Reclaimer = (*sandbox)(nil)

// Reclaim implements backend.Reclaimer with the snapshot to disk: the
// VMM saves memory and devices and exits, so the VM holds no RAM until
// Resume restores it. A networked VM is refused: its VMM holds the
// network namespace, so it only pauses in memory.
func (s *sandbox) Reclaim(ctx context.Context, _ bool) (before, after backend.Memory, err error) {
	if s.m.Net != nil {
		return before, after, errdefs.NotSupported("not supported: pause --reclaim of networked microVM %s (its VMM holds the network namespace; pause keeps it in memory)", s.m.id)
	}
	if before, err = s.Memory(ctx); err != nil {
		return before, after, err
	}
	if err := s.Snapshot(ctx); err != nil {
		return before, after, err
	}
	after, err = s.Memory(ctx)
	return before, after, err
}

// Memory implements backend.Reclaimer: the VMM's resident memory, and the
// snapshot file's blocks as "swapped" while the VM is snapshotted.
func (s *sandbox) Memory(ctx context.Context) (backend.Memory, error) {
	st, err := s.Stats(ctx)
	if err != nil {
		return backend.Memory{}, err
	}
	m := backend.Memory{ResidentBytes: st.MemoryBytes}
	if s.Checkpointed() {
		fi, err := os.Stat(s.m.path(snapshotFile))
		if err != nil {
			return m, fmt.Errorf("sandbox %s: snapshot file: %w", s.m.id, err)
		}
		m.SwappedBytes = fi.Size()
	}
	return m, nil
}
