// Package cgroup owns the sandbox cgroups: one directory per sandbox under a
// configurable parent in every hierarchy corral uses (beside it, as
// parent@id, in the v1 cpu hierarchy: flatcpu.go), on cgroup v1+v2
// (hybrid) and pure v2 hosts alike. Callers see one Group type; which file
// in which hierarchy backs a limit, the freezer or the OOM counter is decided
// here, from a mode detected once per process. It imports the standard
// library, golang.org/x/sys/unix and mountinfo (to find the hierarchies);
// never a backend, the node or the API layers (internal/deptest).
package cgroup

import (
	"errors"
	"fmt"
	"iter"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/corral-dev/corral/internal/mountinfo"
)

// v1Controllers are the v1 controllers a sandbox is placed in. cpuset is left
// out on purpose: a v1 cpuset cgroup refuses tasks until cpus and mems are
// copied in, and corral does not pin CPUs.
var v1Controllers = []string{"memory", "cpu", "cpuacct", "pids", "freezer", "blkio"}

// distinctV1 yields, in v1Controllers order, each directory of dirs (a
// controller's mount or cgroup) once, with the first controller having it:
// co-mounted controllers share one.
func distinctV1(dirs map[string]string) iter.Seq2[string, string] {
	return func(yield func(controller, dir string) bool) {
		seen := map[string]bool{}
		for _, c := range v1Controllers {
			d := dirs[c]
			if d == "" || seen[d] {
				continue
			}
			seen[d] = true
			if !yield(c, d) {
				return
			}
		}
	}
}

// Hierarchies is the cgroup layout of this host.
type Hierarchies struct {
	// V1 maps a v1 controller name to its mount point; empty on pure v2.
	V1 map[string]string
	// V2 is the cgroup2 mount point ("" when there is none).
	V2 string
	// V2Controllers are the controllers available in V2 (none on hybrid).
	V2Controllers map[string]bool
}

// Unified reports a pure v2 host: the limits live in the v2 tree.
func (h *Hierarchies) Unified() bool { return len(h.V1) == 0 && h.V2 != "" }

// Has reports whether groups get controller ctrl where their limits live:
// the v2 tree on a pure v2 host, else a v1 hierarchy.
func (h *Hierarchies) Has(ctrl string) bool {
	if h.Unified() {
		return h.V2Controllers[ctrl]
	}
	return h.V1[ctrl] != ""
}

var (
	detectOnce sync.Once
	detected   *Hierarchies
	detectErr  error
)

// Detect returns the host's cgroup layout, read once from mountinfo.
func Detect() (*Hierarchies, error) {
	detectOnce.Do(func() { detected, detectErr = detect() })
	return detected, detectErr
}

func detect() (*Hierarchies, error) {
	mounts, err := mountinfo.Read()
	if err != nil {
		return nil, fmt.Errorf("cgroup: detect: %w", err)
	}
	h := &Hierarchies{V1: map[string]string{}, V2Controllers: map[string]bool{}}
	for _, m := range mounts {
		switch m.FSType {
		case "cgroup2":
			if h.V2 == "" {
				h.V2 = m.MountPoint
			}
		case "cgroup":
			for _, c := range v1Controllers {
				if m.HasSuperOption(c) && h.V1[c] == "" {
					h.V1[c] = m.MountPoint
				}
			}
		}
	}
	if h.V2 != "" {
		b, err := os.ReadFile(filepath.Join(h.V2, "cgroup.controllers"))
		if err == nil {
			for _, c := range strings.Fields(string(b)) {
				h.V2Controllers[c] = true
			}
		}
	}
	if h.V1["memory"] == "" && !h.V2Controllers["memory"] {
		return nil, errors.New("cgroup: not supported: no memory controller (needs cgroup v1 memory or v2 with memory)")
	}
	return h, nil
}

// Manager places sandboxes under one parent cgroup name.
type Manager struct {
	h      *Hierarchies
	parent string
	idle   bool // the parent is SCHED_IDLE (cpu.idle)
}

// NewManager returns a manager for sandboxes under parent (e.g. "corral").
func NewManager(parent string) (*Manager, error) {
	if parent == "" || strings.Contains(parent, "..") {
		return nil, fmt.Errorf("cgroup: invalid parent %q", parent)
	}
	if strings.Contains(parent, FlatCPUSep) {
		return nil, fmt.Errorf("cgroup: invalid parent %q: must not contain %q (it names sandboxes' cpu cgroups)", parent, FlatCPUSep)
	}
	h, err := Detect()
	if err != nil {
		return nil, err
	}
	return &Manager{h: h, parent: parent}, nil
}

// ErrNoIdle: the host cannot make a cgroup SCHED_IDLE.
var ErrNoIdle = errors.New("cgroup: best-effort sandboxes are not supported")

// IdleSuffix ends the name of the parent of Idle.
const IdleSuffix = "-besteffort"

// Idle returns the manager of best-effort sandboxes: their parent, beside
// m's at the top of the cpu hierarchy, has cpu.idle set, so that the whole
// subtree runs only when no other group or top-level task (the node
// daemon included) wants the CPU, and any of them waking preempts it at
// once. (cpu.idle on the sandbox's own cgroup would only act towards its
// siblings: the parent would still compete with the node at full weight.)
func (m *Manager) Idle() *Manager {
	return &Manager{h: m.h, parent: m.parent + IdleSuffix, idle: true}
}

// Hierarchies returns the detected layout.
func (m *Manager) Hierarchies() *Hierarchies { return m.h }

// dirs returns the parent directories, one per hierarchy.
func (m *Manager) dirs() []string {
	var out []string
	for _, mnt := range distinctV1(m.h.V1) {
		out = append(out, filepath.Join(mnt, m.parent))
	}
	if m.h.V2 != "" {
		out = append(out, filepath.Join(m.h.V2, m.parent))
	}
	return out
}

// Group returns the sandbox cgroup id (it may or may not exist).
func (m *Manager) Group(id string) *Group {
	g := &Group{id: id, v1: map[string]string{}, roots: map[string]string{}, unified: m.h.Unified()}
	for _, c := range v1Controllers {
		if mnt := m.h.V1[c]; mnt != "" {
			g.v1[c] = filepath.Join(mnt, m.parent, id)
			if m.flatCPU() && mnt == m.h.V1["cpu"] { // cpuacct too where co-mounted
				g.v1[c] = m.flatCPUDir(id)
			}
			g.roots[c] = mnt
		}
	}
	if m.h.V2 != "" {
		g.v2 = filepath.Join(m.h.V2, m.parent, id)
	}
	return g
}

// List returns the ids that have a cgroup directory in any hierarchy.
func (m *Manager) List() ([]string, error) {
	seen := map[string]bool{}
	var ids []string
	for _, d := range m.dirs() {
		ents, err := os.ReadDir(d)
		if err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("cgroup: list %s: %w", d, err)
		}
		for _, e := range ents {
			if e.IsDir() && !seen[e.Name()] {
				seen[e.Name()] = true
				ids = append(ids, e.Name())
			}
		}
	}
	flat, err := m.listFlatCPU()
	for _, id := range flat {
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, err
}

// RemoveParent removes the (empty) parent directories.
func (m *Manager) RemoveParent() error {
	var errs []error
	for _, d := range m.dirs() {
		if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// setIdle writes cpu.idle of an idle manager's parent.
func (m *Manager) setIdle() error {
	if !m.idle {
		return nil
	}
	dir := ""
	switch {
	case m.h.V1["cpu"] != "":
		dir = filepath.Join(m.h.V1["cpu"], m.parent)
	case m.h.Unified() && m.h.V2Controllers["cpu"]:
		dir = filepath.Join(m.h.V2, m.parent)
	default:
		return fmt.Errorf("%w: no cpu controller", ErrNoIdle)
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu.idle"), []byte("1"), 0); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: no cpu.idle (needs Linux 5.15 or later)", ErrNoIdle)
		}
		return fmt.Errorf("cgroup: set %s idle: %w", dir, err)
	}
	return nil
}

// ensureParent creates the parent directories and, on pure v2, enables the
// controllers sandboxes need in the root and parent subtree_control.
func (m *Manager) ensureParent() error {
	for _, d := range m.dirs() {
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("cgroup: create parent: %w", err)
		}
	}
	if err := m.setIdle(); err != nil {
		return err
	}
	if !m.h.Unified() {
		return nil
	}
	var enable []string
	for _, c := range []string{"memory", "cpu", "pids", "io"} {
		if m.h.V2Controllers[c] {
			enable = append(enable, "+"+c)
		}
	}
	for _, d := range []string{m.h.V2, filepath.Join(m.h.V2, m.parent)} {
		if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"),
			[]byte(strings.Join(enable, " ")), 0); err != nil {
			return fmt.Errorf("cgroup: enable controllers in %s: %w", d, err)
		}
	}
	return nil
}
