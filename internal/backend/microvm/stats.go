package microvm

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

var (
	_ backend.StatsReader  = (*sandbox)(nil)
	_ backend.Checkpointer = (*sandbox)(nil)
)

// Checkpointed implements backend.Checkpointer: no VMM runs while the VM's
// state is in its snapshot files.
func (s *sandbox) Checkpointed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc == nil && !s.stopped
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times (100 on
// every Linux architecture corral runs on).
const clockTicks = 100

// Stats implements backend.StatsReader from the host side, without asking
// the guest: the VMM's CPU time and resident memory (what the VM costs the
// node, guest RAM it touched included), its one process, and the blocks
// the writable disk image holds. A snapshotted VM has no VMM: zero CPU and
// memory.
func (s *sandbox) Stats(_ context.Context) (backend.Stats, error) {
	var st backend.Stats
	var fi syscall.Stat_t
	if err := syscall.Stat(s.m.path(diskFile), &fi); err == nil {
		st.DiskBytes = fi.Blocks * 512
	}
	s.mu.Lock()
	proc := s.proc
	s.mu.Unlock()
	if proc == nil {
		return st, nil
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", proc.Pid))
	if err != nil {
		return st, fmt.Errorf("sandbox %s: stats: %w", s.m.id, err)
	}
	// Fields after the command name (which may hold spaces) in ")": utime
	// and stime are the 12th and 13th, rss (pages) the 22nd.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 22 {
		return st, fmt.Errorf("sandbox %s: stats: short /proc stat", s.m.id)
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	rss, _ := strconv.ParseInt(f[21], 10, 64)
	st.CPUTime = time.Duration(utime+stime) * time.Second / clockTicks
	st.MemoryBytes = rss * int64(os.Getpagesize())
	st.Pids = 1
	return st, nil
}
