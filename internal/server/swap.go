package server

import "github.com/corral-dev/corral/internal/swaparea"

// setupSwap makes the node's swap area when Config.SwapBytes asks for one,
// and otherwise removes one a previous run left (it crashed, or ran with --swap).
func setupSwap(cfg Config) (*swaparea.Area, error) {
	if cfg.SwapBytes <= 0 {
		return nil, swaparea.Remove(swaparea.Path(cfg.DataDir), cfg.Logger)
	}
	return swaparea.Setup(cfg.DataDir, cfg.SwapBytes, cfg.Logger)
}
