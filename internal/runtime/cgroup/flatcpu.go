package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// FlatCPUSep joins a parent and a sandbox id in the name of the sandbox's
// own cgroup at the top of the v1 cpu hierarchy: "corral@<id>". Parent
// names must not contain it, so that a name is read back one way only.
const FlatCPUSep = "@"

// flatCPU reports whether sandboxes of m get their v1 cpu cgroup beside
// the parent (parent@id) instead of under it. Under one parent, a busy
// sandbox keeps the parent's scheduling entity runnable at the top of the
// hierarchy, so a neighbour's wake-up (an exec) inherits no wake-up credit
// there and waits for the parent's turn against every other task of the
// host: B's exec p50 doubled and its p99 tripled under A's CPU spin on a
// loaded 2-core host, and stayed at idle with B's cgroup at the top
// (docs/limits.md). Each sandbox's CPU weight, quota and accounting are
// its own cgroup's either way. Best-effort sandboxes stay under their
// SCHED_IDLE parent: that parent is what makes them idle towards the node.
// Pure v2 keeps the nested layout (one tree, delegated from the parent).
func (m *Manager) flatCPU() bool { return !m.idle && m.h.V1["cpu"] != "" }

// flatCPUDir is the top-level cpu cgroup of sandbox id (flat layout).
func (m *Manager) flatCPUDir(id string) string {
	return filepath.Join(m.h.V1["cpu"], m.parent+FlatCPUSep+id)
}

// listFlatCPU returns the ids that have a flat cpu cgroup of this parent.
func (m *Manager) listFlatCPU() ([]string, error) {
	if !m.flatCPU() {
		return nil, nil
	}
	dir := filepath.Dir(m.flatCPUDir("x"))
	prefix := filepath.Base(m.parent) + FlatCPUSep
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("cgroup: list %s: %w", dir, err)
	}
	var ids []string
	for _, e := range ents {
		if id, ok := strings.CutPrefix(e.Name(), prefix); ok && e.IsDir() && id != "" {
			ids = append(ids, id)
		}
	}
	return ids, nil
}
