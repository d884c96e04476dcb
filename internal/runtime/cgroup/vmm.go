package cgroup

import (
	"fmt"
	"os"
	"strconv"
)

// Ensure makes group id's directories where they are missing and writes
// no limit: a VMM's group outlives the VMM when the VM is snapshotted,
// and its restore joins it again.
func (m *Manager) Ensure(id string) (*Group, error) {
	if err := m.ensureParent(); err != nil {
		return nil, err
	}
	g := m.Group(id)
	for _, d := range g.allDirs() {
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			return g, fmt.Errorf("cgroup %s: %w", id, err)
		}
	}
	return g, nil
}

// SetCPU sets the group's CFS quota to millis (1000 = one core) per
// 100 ms period; 0 lifts it.
func (g *Group) SetCPU(millis int64) error {
	quota := strconv.FormatInt(millis*cpuPeriodUS/1000, 10)
	var err error
	switch {
	case g.unified:
		if millis <= 0 {
			quota = "max"
		}
		err = write(g.v2, "cpu.max", quota+" "+strconv.Itoa(cpuPeriodUS))
	case g.v1["cpu"] != "":
		if millis <= 0 {
			quota = "-1"
		}
		if err = write(g.v1["cpu"], "cpu.cfs_period_us", strconv.Itoa(cpuPeriodUS)); err == nil {
			err = write(g.v1["cpu"], "cpu.cfs_quota_us", quota)
		}
	default:
		err = fmt.Errorf("no cpu controller")
	}
	if err != nil {
		return fmt.Errorf("cgroup %s: cpu limit: %w", g.id, err)
	}
	return nil
}

// AddProc moves process pid, every thread of it, into the group in every
// hierarchy.
func (g *Group) AddProc(pid int) error {
	for _, d := range g.allDirs() {
		if err := write(d, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("cgroup %s: add process %d: %w", g.id, pid, err)
		}
	}
	return nil
}
