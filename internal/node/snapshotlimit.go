package node

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// DefaultMaxSnapshots is the node's snapshot count limit when none is set.
const DefaultMaxSnapshots = 64

// SnapshotLimits bound the snapshots one node keeps (corral serve
// --max-snapshots, --snapshot-bytes): a snapshot that would pass either is
// refused with ResourceExhausted before anything is written. Fork's
// snapshot counts too, for as long as the fork takes.
type SnapshotLimits struct {
	// Count is the most snapshots kept at once (0: DefaultMaxSnapshots;
	// negative: no limit).
	Count int
	// Bytes is the most bytes they take on disk (0: half the size of the
	// filesystem holding the data dir; negative: no limit). A snapshot in
	// the making counts as its sandbox's memory size, the least its RAM
	// image takes, until its real size is known.
	Bytes int64
}

// resolve fills the defaults; dataDir's filesystem sizes the byte limit.
func (l SnapshotLimits) resolve(dataDir string) (SnapshotLimits, error) {
	if l.Count == 0 {
		l.Count = DefaultMaxSnapshots
	}
	if l.Bytes == 0 {
		var st unix.Statfs_t
		if err := unix.Statfs(dataDir, &st); err != nil {
			return l, fmt.Errorf("snapshot limit: size of %s: %w", dataDir, err)
		}
		l.Bytes = int64(st.Blocks) * st.Bsize / 2
	}
	return l, nil
}

// reserveSnapshot admits one more snapshot of a sandbox with memBytes of
// memory under the node's limits, counting it as in the making until the
// returned release is called (after its record is kept, or it failed).
func (n *Node) reserveSnapshot(memBytes int64) (release func(), err error) {
	lim, err := n.cfg.Snapshots.resolve(n.cfg.DataDir)
	if err != nil {
		return nil, err
	}
	n.snaps.mu.Lock()
	defer n.snaps.mu.Unlock()
	count, used := n.snaps.making, n.snaps.makingBytes
	for _, s := range n.snaps.byID {
		count++
		used += s.Bytes
	}
	if lim.Count > 0 && count+1 > lim.Count {
		return nil, errdefs.ResourceExhausted("snapshots: the node keeps at most %d (--max-snapshots) and holds %d; delete one first", lim.Count, count)
	}
	if lim.Bytes > 0 && used+memBytes > lim.Bytes {
		return nil, errdefs.ResourceExhausted("snapshots: the node keeps at most %s of them (--snapshot-bytes); they use %s, and this one needs at least %s (the sandbox's memory); delete one first",
			formatBytes(lim.Bytes), formatBytes(used), formatBytes(memBytes))
	}
	n.snaps.making++
	n.snaps.makingBytes += memBytes
	return func() {
		n.snaps.mu.Lock()
		n.snaps.making--
		n.snaps.makingBytes -= memBytes
		n.snaps.mu.Unlock()
	}, nil
}
