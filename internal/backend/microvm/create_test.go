package microvm

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/backend"
)

// TestCreateFailureAtEachStep: a create that fails at any step (a failure
// injected before the step runs) leaves no VMM process or run dir behind,
// and a networked one no veth beyond the pool's. No guest boots: the
// last step, the agent handshake, is the one that would wait for it.
func TestCreateFailureAtEachStep(t *testing.T) {
	lab, cfg := newLab(t)
	b := newBackend(t, func(c *Config) { c.Network = newManager(t, cfg) })
	defer func() { failStep = "" }()
	for _, networked := range []bool{false, true} {
		for _, st := range createSteps {
			failStep = st.Name
			spec := testSpec(t)
			if networked {
				spec.Network = backend.Network{Mode: "allowlist", Allow: []string{"pypi"}}
			}
			_, err := b.Create(context.Background(), spec)
			if !errors.Is(err, backend.ErrInjected) || !strings.Contains(err.Error(), st.Name) {
				t.Fatalf("step %s (networked %v): want the injected failure, got %v", st.Name, networked, err)
			}
			for _, l := range leftovers(t, b, spec.ID) {
				t.Errorf("step %s (networked %v): left on the host: %s", st.Name, networked, l)
			}
			// At most the pool's ready namespace and the one its filler
			// holds until there is room.
			ports, err := lab.SandboxVeths()
			if err != nil {
				t.Fatal(err)
			}
			if len(ports) > 2 {
				t.Errorf("step %s (networked %v): veths left: %v", st.Name, networked, ports)
			}
		}
	}
	failStep = ""
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	spec := testSpec(t)
	if _, err := b.Create(ctx, spec); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled create: %v", err)
	}
	for _, l := range leftovers(t, b, spec.ID) {
		t.Errorf("cancelled create: left on the host: %s", l)
	}
}
