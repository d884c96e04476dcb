package qemu

import (
	"context"
	"fmt"
	"io"
	"syscall"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentclient"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// Stats is a VM's backend.Stats from the host side, without asking the
// guest: the VMM's CPU time and resident memory (ProcStats), its one
// process, and the blocks its writable disk holds. A snapshotted VM (proc
// nil) has no VMM: zero CPU and memory.
func Stats(id, disk string, proc *launch.Process) (backend.Stats, error) {
	var st backend.Stats
	var fi syscall.Stat_t
	if err := syscall.Stat(disk, &fi); err == nil {
		st.DiskBytes = fi.Blocks * 512
	}
	if proc == nil {
		return st, nil
	}
	cpu, rss, err := ProcStats(proc.Pid)
	if err != nil {
		return st, fmt.Errorf("sandbox %s: stats: %w", id, err)
	}
	st.CPUTime, st.MemoryBytes, st.Pids = cpu, rss, 1
	return st, nil
}

// RecoverNet re-attaches the network slot rec (nil: the VM has none) of a
// sandbox a restarted daemon recovers; its programs and maps are still on
// the veth, which QEMU's hold on the namespace kept.
func RecoverNet(ctx context.Context, mgr *netpolicy.Manager, id string, rec *netpolicy.Record) (*netpolicy.Sandbox, error) {
	if rec == nil {
		return nil, nil
	}
	if mgr == nil {
		return nil, errdefs.NotFound("sandbox %s: networked, but this node runs without a network manager", id)
	}
	ns, err := mgr.Recover(ctx, id, "", *rec)
	if err != nil {
		return nil, errdefs.NotFound("sandbox %s: %v", id, err)
	}
	return ns, nil
}

// CopyIn has the guest's corral-agent extract a tar stream below dir
// (with the safefs code a container's node uses).
func CopyIn(ctx context.Context, id string, a *agentclient.Client, dir string, r io.Reader) (entries, bytes int64, err error) {
	entries, bytes, err = a.CopyIn(ctx, dir, r)
	if err != nil {
		return entries, bytes, fmt.Errorf("sandbox %s: copy into %s: %w", id, dir, err)
	}
	return entries, bytes, nil
}

// CopyOut has the guest's corral-agent archive path and stream the tar.
func CopyOut(ctx context.Context, id string, a *agentclient.Client, path string, w io.Writer) error {
	if err := a.CopyOut(ctx, path, w); err != nil {
		return fmt.Errorf("sandbox %s: copy out %s: %w", id, path, err)
	}
	return nil
}
