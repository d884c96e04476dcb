package initproc

import (
	"errors"
	"fmt"

	"github.com/corral-dev/corral/internal/guest/initproto"
	"github.com/corral-dev/corral/internal/runtime/seccomp"
)

// installSeccomp installs the sandbox's seccomp filter, compiled by the node,
// on the calling thread, which then re-executes the serving stage of init:
// every thread and process of it inherits the filter. It is the one place
// that knows the seccomp package.
func installSeccomp(cfg *initproto.Config) error {
	if len(cfg.Seccomp) == 0 {
		return errors.New("seccomp: the config carries no filter")
	}
	prog, err := seccomp.Decode(cfg.Seccomp)
	if err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	return seccomp.InstallThread(prog)
}
