package container

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CPUUsage implements backend.Resetter: the CPU time of every process the
// sandbox has run, from its cgroup's accounting (a pooled sandbox's held
// file).
func (s *sandbox) CPUUsage() (time.Duration, error) {
	var d time.Duration
	var err error
	if s.pool != nil {
		s.pool.mu.Lock()
		d, err = s.pool.watch.CPUUsage()
		s.pool.mu.Unlock()
	} else {
		d, err = s.group.CPUUsage()
	}
	if err != nil {
		return 0, fmt.Errorf("sandbox %s: %w", s.id, err)
	}
	return d, nil
}

// KillAllBut implements backend.Resetter: it SIGKILLs every process of the
// sandbox's cgroup but init and those whose pid inside the sandbox is in
// keep, until none is left. Each is signalled through a pidfd opened before
// its pid is checked, so a pid reused meanwhile is never hit.
func (s *sandbox) KillAllBut(ctx context.Context, keep []int) error {
	for {
		pids, err := s.procs()
		if err != nil {
			return fmt.Errorf("sandbox %s: kill: %w", s.id, err)
		}
		left := 0
		for _, p := range pids {
			if p == s.proc.Pid {
				continue
			}
			fd, err := unix.PidfdOpen(p, 0)
			if err != nil {
				continue // gone
			}
			if in, ok := innerPid(p); ok && !slices.Contains(keep, in) && in != 1 {
				if unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
					left++
				}
			}
			unix.Close(fd)
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s: kill: processes left: %w", s.id, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// procs lists the sandbox's processes (a pooled sandbox's through its held
// file).
func (s *sandbox) procs() ([]int, error) {
	if s.pool == nil {
		return s.group.Procs()
	}
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	return s.pool.watch.Procs()
}

// innerPid is host pid p's pid in its own (innermost) PID namespace, the
// last field of NSpid in /proc/p/status.
func innerPid(p int) (int, bool) {
	f, err := os.Open("/proc/" + strconv.Itoa(p) + "/status")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0, false
			}
			n, err := strconv.Atoi(f[len(f)-1])
			return n, err == nil
		}
	}
	return 0, false
}
