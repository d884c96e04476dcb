package microvm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/backend/backendtest"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
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
		Leftovers: func(id string) []string { return leftovers(t, cfg, id) },
		Timeout:   4 * time.Minute,
		// A stopped guest cannot answer; the node resumes it first.
		NoCallsWhilePaused: "microvm: file calls go through the guest agent, which cannot answer while its vCPUs are stopped",
	})
}

// leftovers lists what of sandbox id remains on the host: a VMM process,
// its cgroup or its run dir.
func leftovers(t *testing.T, cfg Config, id string) []string {
	var out []string
	for _, pid := range vmmProcesses(cfg.RunDir)[id] {
		out = append(out, "VMM process "+strconv.Itoa(pid))
	}
	cg, err := qemuvm.NewCPUGroups(cfg.CgroupParent, "microvm")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := cg.List()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(ids, id) {
		out = append(out, "VMM cgroup")
	}
	if _, err := os.Lstat(filepath.Join(cfg.RunDir, id)); !os.IsNotExist(err) {
		out = append(out, "run dir")
	}
	return out
}
