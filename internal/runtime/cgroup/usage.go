package cgroup

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Usage is what a group's processes use now.
type Usage struct {
	CPU         time.Duration // cumulative CPU time since the group was made
	MemoryBytes int64         // charged memory, page cache included (what the limit applies to)
	CacheBytes  int64         // of which page cache
	Pids        int64
}

// Usage reads the group's counters: cpuacct.usage, memory.usage_in_bytes
// and pids.current on v1; cpu.stat, memory.current and pids.current on
// v2; and, with cache, memory.stat for CacheBytes. memory.stat is the
// dear one (the kernel formats some forty counters, on v1 summed over the
// hierarchy): the node's sampler, which reads every sandbox every few
// seconds, does without it.
func (g *Group) Usage(cache bool) (Usage, error) {
	var u Usage
	if g.unified {
		usec, err := readKey(filepath.Join(g.v2, "cpu.stat"), "usage_usec")
		if err != nil {
			return u, fmt.Errorf("cgroup %s: cpu: %w", g.id, err)
		}
		u.CPU = time.Duration(usec) * time.Microsecond
		if u.MemoryBytes, err = readInt(filepath.Join(g.v2, "memory.current")); err != nil {
			return u, fmt.Errorf("cgroup %s: memory: %w", g.id, err)
		}
		if cache {
			if u.CacheBytes, err = readStat(filepath.Join(g.v2, "memory.stat"), "file"); err != nil {
				return u, fmt.Errorf("cgroup %s: %w", g.id, err)
			}
		}
		if u.Pids, err = readInt(filepath.Join(g.v2, "pids.current")); err != nil {
			return u, fmt.Errorf("cgroup %s: pids: %w", g.id, err)
		}
		return u, nil
	}
	ns, err := readInt(filepath.Join(g.v1["cpuacct"], "cpuacct.usage"))
	if err != nil {
		return u, fmt.Errorf("cgroup %s: cpu: %w", g.id, err)
	}
	u.CPU = time.Duration(ns)
	if u.MemoryBytes, err = readInt(filepath.Join(g.v1["memory"], "memory.usage_in_bytes")); err != nil {
		return u, fmt.Errorf("cgroup %s: memory: %w", g.id, err)
	}
	if cache {
		if u.CacheBytes, err = readStat(filepath.Join(g.v1["memory"], "memory.stat"), "total_cache"); err != nil {
			return u, fmt.Errorf("cgroup %s: %w", g.id, err)
		}
	}
	if g.v1["pids"] != "" {
		if u.Pids, err = readInt(filepath.Join(g.v1["pids"], "pids.current")); err != nil {
			return u, fmt.Errorf("cgroup %s: pids: %w", g.id, err)
		}
	}
	return u, nil
}

// readStat reads one counter of a memory.stat file.
func readStat(file, key string) (int64, error) {
	v, err := readKey(file, key)
	if err != nil {
		return 0, fmt.Errorf("memory.stat: %w", err)
	}
	return int64(v), nil
}

// readInt reads a file holding one number (through readSmall: no poller).
func readInt(file string) (int64, error) {
	b, err := readSmall(file)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
