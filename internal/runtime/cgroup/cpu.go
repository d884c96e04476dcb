package cgroup

import (
	"fmt"
	"os"
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
	if g.unified || g.v1["cpuacct"] == "" {
		us, err := readKey(filepath.Join(g.v2, "cpu.stat"), "usage_usec")
		if err != nil {
			return 0, fmt.Errorf("cgroup %s: cpu usage: %w", g.id, err)
		}
		return time.Duration(us) * time.Microsecond, nil
	}
	b, err := os.ReadFile(filepath.Join(g.v1["cpuacct"], "cpuacct.usage"))
	if err != nil {
		return 0, fmt.Errorf("cgroup %s: cpu usage: %w", g.id, err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroup %s: cpu usage: %w", g.id, err)
	}
	return time.Duration(ns), nil
}
