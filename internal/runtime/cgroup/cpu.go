package cgroup

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CPUUsage is the CPU time (user and system) every process of the group
// has used since it was made, exited ones included: v1 cpuacct.usage, v2
// cpu.stat's usage_usec. Unlike wait4 of one child it counts detached and
// re-parented processes too.
func (g *Group) CPUUsage() (time.Duration, error) {
	file, cpuStat := g.cpuFile()
	b, err := readSmall(file)
	if err != nil {
		return 0, fmt.Errorf("cgroup %s: cpu usage: %w", g.id, err)
	}
	return g.parseCPUUsage(b, cpuStat)
}

// cpuFile is the group's CPU usage file, and whether it is v2's cpu.stat
// (else v1's cpuacct.usage).
func (g *Group) cpuFile() (file string, cpuStat bool) {
	if g.unified || g.v1["cpuacct"] == "" {
		return filepath.Join(g.v2, "cpu.stat"), true
	}
	return filepath.Join(g.v1["cpuacct"], "cpuacct.usage"), false
}

// parseCPUUsage reads the content of the file cpuFile names.
func (g *Group) parseCPUUsage(b []byte, cpuStat bool) (time.Duration, error) {
	if cpuStat {
		us, err := keyValue(b, "usage_usec")
		if err != nil {
			return 0, fmt.Errorf("cgroup %s: cpu usage: %w", g.id, err)
		}
		return time.Duration(us) * time.Microsecond, nil
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroup %s: cpu usage: %w", g.id, err)
	}
	return time.Duration(ns), nil
}
