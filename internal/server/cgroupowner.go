package server

import (
	"errors"
	"fmt"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
)

// cgroupClaims hold the daemon's cgroup parents (its own and the
// best-effort one) from the start of Start to the end of Stop.
type cgroupClaims []*cgroup.Claim

// claimCgroupParents takes the parents before anything else is set up: a
// daemon whose parent another live daemon holds must not start (its
// start-up sweep would take that daemon's sandboxes), and must leave
// nothing behind when it refuses.
func claimCgroupParents(cfg Config) (cgroupClaims, error) {
	m, err := cgroup.NewManager(cgroupParent(cfg))
	if err != nil {
		return nil, errdefs.NotSupported("cgroups: %v", err)
	}
	var claims cgroupClaims
	for _, m := range []*cgroup.Manager{m, m.Idle()} {
		c, err := m.Claim(cfg.DataDir)
		if err != nil {
			claims.release()
			var owned *cgroup.OwnedError
			if errors.As(err, &owned) {
				return nil, errdefs.FailedPrecondition("%v", err)
			}
			return nil, fmt.Errorf("claim cgroup parent: %w", err)
		}
		claims = append(claims, c)
	}
	return claims, nil
}

// release gives the parents up; a second call does nothing.
func (cs cgroupClaims) release() error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Release())
	}
	return errors.Join(errs...)
}

// defaultNodeMemoryLow is the node's memory protection on cgroup v2 when
// Config.NodeMemoryLow is unset.
const defaultNodeMemoryLow = 256 << 20

// enterNodeCgroup moves the daemon into its own cgroup (Config.NodeCgroup)
// before it starts any helper, so that the helpers (the lazy blob server)
// and every service in the process (the API, the DNS proxy) run with the
// node's CPU weight and memory protection, not in competition with the
// sandboxes at equal weight.
func enterNodeCgroup(cfg Config) (*cgroup.NodeGroup, error) {
	if cfg.NodeCgroup == "" {
		return nil, nil
	}
	m, err := cgroup.NewManager(cgroupParent(cfg))
	if err != nil {
		return nil, errdefs.NotSupported("cgroups: %v", err)
	}
	low := cfg.NodeMemoryLow
	if low == 0 {
		low = defaultNodeMemoryLow
	}
	parent := cgroupParent(cfg)
	ng, err := m.EnterNode(cfg.NodeCgroup, []string{parent, parent + cgroup.IdleSuffix}, cgroup.NodeReserve{MemoryLow: low})
	if err != nil {
		return nil, fmt.Errorf("node cgroup (corral serve --node-cgroup none keeps the daemon where it was started): %w", err)
	}
	cfg.Logger.Info("node cgroup", "dirs", ng.Dirs(), "cpu_shares_v1", cgroup.NodeCPUSharesV1, "cpu_weight_v2", cgroup.NodeCPUWeightV2)
	return ng, nil
}
