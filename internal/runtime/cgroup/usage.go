package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Usage is a group's resource use at one moment.
type Usage struct {
	CPU         time.Duration // CPU time used since the group was made
	MemoryBytes int64         // memory charged now, page cache included
	CacheBytes  int64         // of which page cache
}

// Usage reads the group's CPU time and memory (v1 cpuacct and memory, or
// v2 cpu.stat and memory.current/memory.stat).
func (g *Group) Usage() (Usage, error) {
	var u Usage
	var err error
	if g.unified {
		var usec uint64
		if usec, err = readKey(filepath.Join(g.v2, "cpu.stat"), "usage_usec"); err == nil {
			u.CPU = time.Duration(usec) * time.Microsecond
			u.MemoryBytes, err = readInt(filepath.Join(g.v2, "memory.current"))
		}
		if err == nil {
			var cache uint64
			cache, err = readKey(filepath.Join(g.v2, "memory.stat"), "file")
			u.CacheBytes = int64(cache)
		}
	} else {
		var ns int64
		if ns, err = readInt(filepath.Join(g.v1["cpuacct"], "cpuacct.usage")); err == nil {
			u.CPU = time.Duration(ns)
			u.MemoryBytes, err = readInt(filepath.Join(g.v1["memory"], "memory.usage_in_bytes"))
		}
		if err == nil {
			var cache uint64
			cache, err = readKey(filepath.Join(g.v1["memory"], "memory.stat"), "total_cache")
			u.CacheBytes = int64(cache)
		}
	}
	if err != nil {
		return Usage{}, fmt.Errorf("cgroup %s: usage: %w", g.id, err)
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
