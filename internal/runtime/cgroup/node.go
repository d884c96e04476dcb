package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The node's CPU weight against the sandboxes' parents, which keep the
// kernel default (v1 cpu.shares 1024, v2 cpu.weight 100): under full
// contention the node gets ~99% of what it asks for, and it asks only for
// what its services use (a flood of the DNS proxy, the API, creates).
const (
	NodeCPUSharesV1 = 102400
	NodeCPUWeightV2 = 10000
)

// NodeReserve is what the node's cgroup is given.
type NodeReserve struct {
	// MemoryLow is the node's memory protection on cgroup v2
	// (memory.low): under host memory pressure the kernel reclaims from
	// the sandboxes before it takes the node below this. v1 has no such
	// file: there the sandboxes' parents get memory.soft_limit_in_bytes 0,
	// so host reclaim turns to them first.
	MemoryLow int64
}

// NodeGroup is the node's own cgroup: the daemon and every helper it
// starts afterwards (the lazy blob server, mkfs workers) run there, apart
// from the sandboxes' parents, with a CPU weight far above theirs.
type NodeGroup struct {
	name string
	dirs []string          // the node cgroup's directories, one per hierarchy joined
	back map[string]string // directory -> the cgroup.procs the daemon came from
}

// EnterNode makes the node cgroup name (beside the sandbox parents, at the
// top of each hierarchy) and moves this process, every thread, into it.
// On a hybrid host it joins the v1 cpu and cpuacct hierarchies only: v1
// memory has no protection for a group (the sandboxes' parents get the
// soft limit instead), and the controller-less v2 tree only carries the
// sandboxes' BPF programs. On pure v2 it joins the one tree. Release
// moves the process back.
func (m *Manager) EnterNode(name string, sandboxParents []string, r NodeReserve) (*NodeGroup, error) {
	if name == "" || strings.Contains(name, "..") || strings.Contains(name, "/") {
		return nil, fmt.Errorf("cgroup: invalid node cgroup %q", name)
	}
	for _, p := range sandboxParents {
		if p == name {
			return nil, fmt.Errorf("cgroup: node cgroup %q is a sandbox parent", name)
		}
	}
	cur, err := readCgroups("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroup: node cgroup: %w", err)
	}
	ng := &NodeGroup{name: name, back: map[string]string{}}
	type step struct {
		mnt, cur string
		files    [][2]string
	}
	var steps []step
	if m.h.Unified() {
		if err := enableV2(m.h, []string{"cpu", "memory"}); err != nil {
			return nil, err
		}
		var files [][2]string
		if m.h.V2Controllers["cpu"] {
			files = append(files, [2]string{"cpu.weight", strconv.Itoa(NodeCPUWeightV2)})
		}
		if m.h.V2Controllers["memory"] && r.MemoryLow > 0 {
			files = append(files, [2]string{"memory.low", strconv.FormatInt(r.MemoryLow, 10)})
		}
		steps = append(steps, step{mnt: m.h.V2, cur: cur[""], files: files})
	} else {
		seen := map[string]bool{}
		for _, c := range []string{"cpu", "cpuacct"} {
			mnt := m.h.V1[c]
			if mnt == "" || seen[mnt] {
				continue
			}
			seen[mnt] = true
			var files [][2]string
			if c == "cpu" {
				files = [][2]string{{"cpu.shares", strconv.Itoa(NodeCPUSharesV1)}}
			}
			steps = append(steps, step{mnt: mnt, cur: cur[c], files: files})
		}
		if mnt := m.h.V1["memory"]; mnt != "" {
			for _, p := range sandboxParents {
				d := filepath.Join(mnt, p)
				if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
					return nil, fmt.Errorf("cgroup: create parent: %w", err)
				}
				if err := write(d, "memory.soft_limit_in_bytes", "0"); err != nil {
					return nil, fmt.Errorf("cgroup: sandbox parent %s: %w", p, err)
				}
			}
		}
	}
	pid := strconv.Itoa(os.Getpid())
	for _, s := range steps {
		d := filepath.Join(s.mnt, name)
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			return nil, errors.Join(fmt.Errorf("cgroup: node cgroup %s: %w", d, err), ng.Release())
		}
		ng.dirs = append(ng.dirs, d)
		for _, f := range s.files {
			if err := write(d, f[0], f[1]); err != nil {
				return nil, errors.Join(fmt.Errorf("cgroup: node cgroup %s: %w", d, err), ng.Release())
			}
		}
		if err := write(d, "cgroup.procs", pid); err != nil {
			return nil, errors.Join(fmt.Errorf("cgroup: enter node cgroup %s: %w", d, err), ng.Release())
		}
		ng.back[d] = filepath.Join(s.mnt, s.cur)
	}
	return ng, nil
}

// Dirs returns the node cgroup's directories.
func (ng *NodeGroup) Dirs() []string { return ng.dirs }

// Release moves the process back to the cgroups it came from and removes
// the node cgroup where nothing is left in it; a helper that outlives the
// daemon (the lazy blob server serving sandboxes that keep running) keeps
// it, and the next start joins it again. A second call does nothing.
func (ng *NodeGroup) Release() error {
	if ng == nil {
		return nil
	}
	pid := strconv.Itoa(os.Getpid())
	var errs []error
	for _, d := range ng.dirs {
		if back, ok := ng.back[d]; ok {
			errs = append(errs, write(back, "cgroup.procs", pid))
		}
		if err := os.Remove(d); err != nil && !os.IsNotExist(err) && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, fmt.Errorf("cgroup: remove node cgroup %s: %w", d, err))
		}
	}
	ng.dirs, ng.back = nil, nil
	return errors.Join(errs...)
}

// enableV2 turns controllers on in the v2 root's subtree_control.
func enableV2(h *Hierarchies, ctrls []string) error {
	var enable []string
	for _, c := range ctrls {
		if h.V2Controllers[c] {
			enable = append(enable, "+"+c)
		}
	}
	if len(enable) == 0 {
		return nil
	}
	return write(h.V2, "cgroup.subtree_control", strings.Join(enable, " "))
}
