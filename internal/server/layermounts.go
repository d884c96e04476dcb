package server

import "github.com/corral-dev/corral/internal/errdefs"

// The values of Config.LayerMounts.
const (
	// LayerMountsShared mounts each layer once for the node: sandboxes
	// share its page cache (a neighbour's reads can be observed: see
	// docs/THREATS.md).
	LayerMountsShared = "shared"
	// LayerMountsPerProject mounts each project's layers apart: page
	// caches of their own, at the cost of memory for each project's copy
	// of a page and a cold cache for a project's first sandboxes.
	LayerMountsPerProject = "per-project"
)

func checkLayerMounts(v string) error {
	switch v {
	case "", LayerMountsShared, LayerMountsPerProject:
		return nil
	}
	return errdefs.InvalidArgument("layer mounts %q: must be %s or %s", v, LayerMountsShared, LayerMountsPerProject)
}
