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
