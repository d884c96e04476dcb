package initproc

import (
	"fmt"

	"github.com/corral-dev/corral/internal/runtime/seccomp"
)

// installSeccomp installs the sandbox's seccomp filter on every thread of
// init (TSYNC); every process init starts inherits it. It is the one place
// that knows the seccomp package.
func installSeccomp() error {
	prog, err := seccomp.Compile(seccomp.DefaultProfile())
	if err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	return seccomp.Install(prog)
}
