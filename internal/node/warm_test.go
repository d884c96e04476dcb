package node

import (
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/state"
)

// TestWarmPoolServesOnlyDefaultCreates: whatever the backend makes a
// sandbox with must be the node's default for a create to take a pooled
// one; what is assigned at hand-out (labels, env, project, timeouts) may
// differ.
func TestWarmPoolServesOnlyDefaultCreates(t *testing.T) {
	n := testNode()
	n.backends = map[string]backend.Backend{warmBackend: nil}
	w := &warmPools{n: n, size: 2}
	admit := func(req CreateRequest) *state.Record {
		t.Helper()
		rec, err := n.admit(req)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	for name, req := range map[string]CreateRequest{
		"defaults":           {},
		"labels env project": {Labels: map[string]string{"a": "b"}, Env: []string{"A=1"}, Project: "p", Workdir: "/tmp", User: "nobody"},
		"mode none":          {Network: backend.Network{Mode: "none"}},
		"another image":      {Image: "debian"},
	} {
		if !w.matches(admit(req)) {
			t.Errorf("%s: not served from the pool", name)
		}
	}
	for name, req := range map[string]CreateRequest{
		"memory":      {Resources: Resources{MemoryBytes: 256 * mib}},
		"cpu":         {Resources: Resources{CPUMillis: 500}},
		"disk":        {Resources: Resources{DiskBytes: 2 * gib}},
		"pids":        {Resources: Resources{Pids: 100}},
		"best effort": {Resources: Resources{BestEffort: true}},
		"io":          {Resources: Resources{IO: state.IOLimits{WriteIOPS: 10}}},
		"network":     {Network: backend.Network{Mode: "allowlist"}},
		"microvm":     {Backend: "microvm"},
	} {
		if w.matches(admit(req)) {
			t.Errorf("%s: served from the pool", name)
		}
	}
	if (&warmPools{n: n}).matches(admit(CreateRequest{})) {
		t.Error("served with --warm-pool 0")
	}
	n.cfg.PerProjectLayerMounts = true
	if w.matches(admit(CreateRequest{})) {
		t.Error("served with per-project layer mounts")
	}
	var none *warmPools
	if _, ok, err := none.handOut(t.Context(), admit(CreateRequest{}), nil, time.Now()); ok || err != nil {
		t.Errorf("a node without pools handed out: %v %v", ok, err)
	}
}
