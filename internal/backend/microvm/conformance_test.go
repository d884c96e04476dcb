package microvm

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/backend/backendtest"
)

// TestConformance runs the backend conformance suite against microVMs. It
// boots one guest and shares it among the subtests (a TCG boot costs
// seconds); the second backend of RestartRecovery reads the same run dir.
// Its VMMs run in cgroups of their own (CPU limits) under a parent of
// this test process.
func TestConformance(t *testing.T) {
	first := newBackend(t, func(c *Config) { c.CgroupParent = fmt.Sprintf("corral-test%d", os.Getpid()) })
	cfg := first.cfg
	backendtest.Run(t, backendtest.Harness{
		New:       backendtest.FirstThen(first, func() (*Backend, error) { return New(cfg) }),
		Spec:      func(t *testing.T) backend.Spec { return testSpec(t) },
		Detach:    func(s backend.Sandbox) { s.(*sandbox).dropSession() },
		Leftovers: func(id string) []string { return leftovers(t, first, id) },
		Timeout:   4 * time.Minute,
		// A stopped guest cannot answer; the node resumes it first.
		NoCallsWhilePaused: "microvm: file calls go through the guest agent, which cannot answer while its vCPUs are stopped",
	})
}

// leftovers lists what of sandbox id remains on the host.
func leftovers(t *testing.T, b *Backend, id string) []string {
	out, err := b.vms.Leftovers(id)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
