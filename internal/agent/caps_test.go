package agent

import (
	"slices"
	"testing"

	"github.com/corral-dev/corral/internal/runtime/initproc"
)

// TestCommandCapsMatchContainers: a microVM command holds exactly the
// capabilities of a container sandbox's.
func TestCommandCapsMatchContainers(t *testing.T) {
	a, b := slices.Clone(commandCaps), slices.Clone(initproc.DefaultCaps)
	slices.Sort(a)
	slices.Sort(b)
	if !slices.Equal(a, b) {
		t.Errorf("agent keeps %v, containers %v", a, b)
	}
}
