package vm

import (
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend/backendtest"
)

// TestVMTerminal: corral-agent in the Debian image runs a shell on a
// terminal of the guest's devpts (the conformance suite checks the same on
// its own VM).
func TestVMTerminal(t *testing.T) {
	_, sb := sharedVM(t)
	backendtest.CheckTerminal(t, sb.Exec, 3*time.Minute)
}
