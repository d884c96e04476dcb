package microvm

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/backend/backendtest"
)

// TestConformance runs the backend conformance suite against microVMs. It
// boots one guest and shares it among the subtests (a TCG boot costs
// seconds); the second backend of RestartRecovery reads the same run dir.
func TestConformance(t *testing.T) {
	first := newBackend(t)
	cfg := first.cfg
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T) backend.Backend {
			if first != nil {
				b := first
				first = nil
				return b
			}
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Spec:      func(t *testing.T) backend.Spec { return testSpec(t) },
		Detach:    func(s backend.Sandbox) { s.(*sandbox).dropSession() },
		Leftovers: func(id string) []string { return leftovers(cfg.RunDir, id) },
		Timeout:   4 * time.Minute,
		// A stopped guest cannot answer; the node resumes it first.
		NoCallsWhilePaused: "microvm: file calls go through the guest agent, which cannot answer while its vCPUs are stopped",
	})
}

// leftovers lists what of sandbox id remains on the host: a VMM process
// or its run dir.
func leftovers(runDir, id string) []string {
	var out []string
	for _, pid := range vmmProcesses(runDir)[id] {
		out = append(out, "VMM process "+strconv.Itoa(pid))
	}
	if _, err := os.Lstat(filepath.Join(runDir, id)); !os.IsNotExist(err) {
		out = append(out, "run dir")
	}
	return out
}
