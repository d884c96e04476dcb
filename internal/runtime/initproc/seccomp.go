package initproc

import (
	"fmt"

	"github.com/corral-dev/corral/internal/runtime/seccomp"
)

// installSeccomp installs the sandbox's seccomp filter on the calling
// thread, which then re-executes the serving stage of init: every thread and
// process of it inherits the filter. It is the one place that knows the
// seccomp package.
func installSeccomp() error {
	prog, err := seccomp.Compile(seccomp.DefaultProfile())
	if err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	return seccomp.InstallThread(prog)
}
