package container

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/storage/upper"
	"golang.org/x/sys/unix"
)

var _ backend.StatsReader = (*sandbox)(nil)

// Stats implements backend.StatsReader from the sandbox's cgroup, its
// writable layer's quota and its network namespace's interfaces.
func (s *sandbox) Stats(_ context.Context) (backend.Stats, error) {
	u, err := s.group.Usage(false)
	if err != nil {
		return backend.Stats{}, fmt.Errorf("sandbox %s: stats: %w", s.id, err)
	}
	base := s.since()
	st := backend.Stats{CPUTime: u.CPU - base.cpu, MemoryBytes: u.MemoryBytes, Pids: u.Pids}
	if n, err := s.group.OOMKills(); err == nil {
		st.OOMKills = n - base.ooms
	}
	// A resettable (fncall) sandbox writes to a tmpfs charged as memory.
	onDisk := s.pool == nil || s.pool.view
	if du, ok := s.b.cfg.Uppers.(upper.Usager); ok && onDisk {
		st.DiskBytes, _, _ = du.Usage(s.id)
	} else if onDisk {
		// overlayfs reports its upper filesystem: the sandbox's own ext4
		// disk for the ext4-image store.
		var fs unix.Statfs_t
		if unix.Statfs(s.rootPath(), &fs) == nil {
			st.DiskBytes = int64(fs.Blocks-fs.Bfree) * fs.Bsize
		}
	}
	if s.net != nil {
		st.NetRxBytes, st.NetTxBytes = netDev(s.proc.Pid)
	}
	return st, nil
}

// netDev sums the byte counters of pid's network namespace's interfaces
// but loopback (zero when they cannot be read).
func netDev(pid int) (rx, tx uint64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/dev", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(name) == "lo" {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) < 9 {
			continue
		}
		r, _ := strconv.ParseUint(fields[0], 10, 64)
		t, _ := strconv.ParseUint(fields[8], 10, 64)
		rx, tx = rx+r, tx+t
	}
	return rx, tx
}
