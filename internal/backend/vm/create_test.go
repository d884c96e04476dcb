package vm

import (
	"context"
	"os"
	"testing"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// TestCreateBadInputs: requests refused before anything is made.
func TestCreateBadInputs(t *testing.T) {
	b := newBackend(t)
	ctx := context.Background()
	for name, mutate := range map[string]func(*backend.Spec){
		"zero memory": func(s *backend.Spec) { s.Resources.MemoryBytes = 0 },
		"tiny memory": func(s *backend.Spec) { s.Resources.MemoryBytes = 64 << 20 },
		"no image":    func(s *backend.Spec) { s.Image = "" },
		"small disk":  func(s *backend.Spec) { s.Resources.DiskBytes = 1 << 20 },
		"bad network": func(s *backend.Spec) { s.Network.Mode = "sometimes" },
	} {
		spec := testSpec()
		mutate(&spec)
		if _, err := b.Create(ctx, spec); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	spec := testSpec()
	spec.Image = "nosuch@1"
	if _, err := b.Create(ctx, spec); !errdefs.IsNotFound(err) {
		t.Errorf("unknown image: %v, want NotFound", err)
	}
	if ents, _ := os.ReadDir(b.cfg.RunDir); len(ents) != 0 {
		t.Errorf("refused creates left %d run dirs", len(ents))
	}
}

// TestCreateStepFailures fails Create at every step up to the guest's
// boot and checks that nothing of the sandbox is left.
func TestCreateStepFailures(t *testing.T) {
	b := newBackend(t)
	for _, st := range createSteps {
		if st.Name == "guest setup" {
			continue // needs a booted guest; its undo is the steps' before
		}
		b.failAt = st.Name
		spec := testSpec()
		_, err := b.Create(context.Background(), spec)
		if err == nil {
			t.Fatalf("failAt %s: create succeeded", st.Name)
		}
		if _, err := os.Stat(b.runDir(spec.ID)); !os.IsNotExist(err) {
			t.Errorf("failAt %s: run dir left (%v)", st.Name, err)
		}
		if left := b.vms.Processes(); len(left) > 0 {
			t.Errorf("failAt %s: qemu left: %v", st.Name, left)
		}
	}
}
