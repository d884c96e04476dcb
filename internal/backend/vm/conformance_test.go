package vm

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/backend/backendtest"
)

// TestConformance runs the backend conformance suite against full VMs.
// The suite boots its own guest (it removes it in RestartRecovery, so the
// package's shared, networked VM cannot serve) and a second one for Stop;
// every call of New after the first is the restarted daemon over the
// same run and image dirs.
func TestConformance(t *testing.T) {
	first := newBackend(t, fmt.Sprintf("corral-test%d", os.Getpid()))
	cfg := first.cfg
	// Built images carry corral-agent, which streams output and stdin and
	// ends an exec with its main process: Streaming and Background run
	// (qemu-ga, for images without it, passes neither; docs/vm.md).
	if im, err := first.images.Get(testRef); err != nil || !im.Agent {
		t.Fatalf("test image %s: %v, agent %v: want corral-agent in it", testRef, err, im.Agent)
	}
	backendtest.Run(t, backendtest.Harness{
		New:       backendtest.FirstThen(first, func() (*Backend, error) { return New(cfg) }),
		Spec:      conformanceSpec,
		Detach:    func(s backend.Sandbox) { s.(*sandbox).qga.close(); s.(*sandbox).agent.close() },
		Leftovers: func(id string) []string { return leftovers(t, first, id) },
		Timeout:   6 * time.Minute,
		// The agents run in the guest: with its vCPUs stopped they cannot answer.
		NoCallsWhilePaused: "vm: exec and file calls go through an agent in the guest, which cannot answer while its vCPUs are stopped",
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

// conformanceSpec gives the guest 384 MiB: the suite's memory bomb (awk
// doubling a string) is OOM-killed only when the guest runs out while
// copying, before it asks for one block larger than the guest's RAM,
// which the kernel refuses outright (awk then exits 2). With 512 MiB which
// comes first depends on how much the guest's own services hold.
func conformanceSpec(t *testing.T) backend.Spec {
	spec := testSpec()
	spec.Resources.MemoryBytes = 384 << 20
	return spec
}
