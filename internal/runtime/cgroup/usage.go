package cgroup

import (
	"fmt"
	"os"
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

// Usage reads the group's counters: cpuacct.usage, memory.usage_in_bytes,
// memory.stat and pids.current on v1; cpu.stat, memory.current,
// memory.stat and pids.current on v2.
func (g *Group) Usage() (Usage, error) {
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
		cache, err := readKey(filepath.Join(g.v2, "memory.stat"), "file")
		if err != nil {
			return u, fmt.Errorf("cgroup %s: memory.stat: %w", g.id, err)
		}
		u.CacheBytes = int64(cache)
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
	cache, err := readKey(filepath.Join(g.v1["memory"], "memory.stat"), "total_cache")
	if err != nil {
		return u, fmt.Errorf("cgroup %s: memory.stat: %w", g.id, err)
	}
	u.CacheBytes = int64(cache)
	if g.v1["pids"] != "" {
		if u.Pids, err = readInt(filepath.Join(g.v1["pids"], "pids.current")); err != nil {
			return u, fmt.Errorf("cgroup %s: pids: %w", g.id, err)
		}
	}
	return u, nil
}

func readInt(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
