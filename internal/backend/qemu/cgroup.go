package qemu

import (
	"context"
	"fmt"
	"sync"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
)

// CPUGroups holds VMMs to their VMs' CPU limits: each VMM runs in a host
// cgroup of its own, <parent>-<backend>/<sandbox id>, with a CFS quota of
// the VM's cpu_millis (its vCPUs are whole cores: the quota is what makes
// a limit below them hold). A nil *CPUGroups (no cgroup parent
// configured) enforces nothing and every method is a no-op.
type CPUGroups struct {
	m *cgroup.Manager
}

// parentMu orders making a group against removing the parent once the
// last group went (every CPUGroups of a parent is in this process).
var parentMu sync.Mutex

// NewCPUGroups returns the groups of backend's VMMs under the node's
// cgroup parent (nil when parent is "": CPU limits are not enforced).
func NewCPUGroups(parent, backend string) (*CPUGroups, error) {
	if parent == "" {
		return nil, nil
	}
	m, err := cgroup.NewManager(parent + "-" + backend)
	if err != nil {
		return nil, fmt.Errorf("vmm cgroups: %w", err)
	}
	return &CPUGroups{m: m}, nil
}

// Enforces is nil when VMMs are held to their CPU limits, else an
// errdefs.NotSupported error saying why not: the backends' answer of
// backend.LimitEnforcer for backend.LimitCPU.
func (g *CPUGroups) Enforces() error {
	if g == nil {
		return errdefs.NotSupported("%s: no cgroup parent configured for the VMMs", backend.LimitCPU)
	}
	if !g.m.Hierarchies().Has("cpu") {
		return errdefs.NotSupported("%s: this host has no cpu cgroup controller", backend.LimitCPU)
	}
	return nil
}

// Join moves VMM pid into sandbox id's group (made if missing) with a
// quota of millis (0: none yet: a first boot, which under TCG needs
// every cycle it gets, is limited once its agent answers).
func (g *CPUGroups) Join(id string, pid int, millis int64) error {
	if g == nil {
		return nil
	}
	parentMu.Lock()
	grp, err := g.m.Ensure(id)
	parentMu.Unlock()
	if err != nil {
		return fmt.Errorf("sandbox %s: vmm cgroup: %w", id, err)
	}
	if g.Enforces() == nil {
		if err := grp.SetCPU(millis); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	if err := grp.AddProc(pid); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// Limit sets the quota of sandbox id's VMM to millis (0 lifts it).
func (g *CPUGroups) Limit(id string, millis int64) error {
	if g == nil || g.Enforces() != nil {
		return nil
	}
	if err := g.m.Group(id).SetCPU(millis); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// List returns the ids that have a group.
func (g *CPUGroups) List() ([]string, error) {
	if g == nil {
		return nil, nil
	}
	return g.m.List()
}

// Remove removes sandbox id's group once its VMM is gone (kill it first),
// and the parent when that was the last group.
func (g *CPUGroups) Remove(ctx context.Context, id string) error {
	if g == nil {
		return nil
	}
	if err := g.m.Group(id).Remove(ctx); err != nil {
		return err
	}
	parentMu.Lock()
	defer parentMu.Unlock()
	if ids, err := g.m.List(); err == nil && len(ids) == 0 {
		_ = g.m.RemoveParent()
	}
	return nil
}
