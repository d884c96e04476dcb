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

// idleSandbox is a pooled sandbox that stays alive.
type idleSandbox struct {
	backend.Sandbox
	done chan struct{}
}

func (s idleSandbox) Done() <-chan struct{} { return s.done }

// recyclingSandbox also implements backend.Recycler.
type recyclingSandbox struct {
	idleSandbox
	backend.Recycler
}

// TestRecycledSandboxesStayInTheirProject: a create takes a sandbox made
// ahead of demand or one recycled from its own project's deletes, never
// one another project used.
func TestRecycledSandboxesStayInTheirProject(t *testing.T) {
	n := testNode()
	w := &warmPools{n: n, size: 1, recycle: 4, pools: map[string]*warmPool{}}
	alive := idleSandbox{done: make(chan struct{})}
	fromA := &warmSandbox{id: "n-a", sb: alive, recycled: true, project: "a"}
	made := &warmSandbox{id: "n-made", sb: alive}
	fromB := &warmSandbox{id: "n-b", sb: alive, recycled: true, project: "b"}
	w.pools["busybox"] = &warmPool{image: "busybox", ready: []*warmSandbox{fromA, made, fromB}, wake: make(chan struct{}, 1)}
	for _, step := range []struct {
		project string
		want    *warmSandbox
	}{{"b", fromB}, {"c", made}, {"c", nil}, {"", nil}, {"a", fromA}} {
		if got := w.take("busybox", step.project); got != step.want {
			t.Fatalf("project %q took %+v, want %+v", step.project, got, step.want)
		}
	}
}

// TestMayRecycle: only a running, recyclable sandbox of the pools' class
// on a recycling node is recycled by its delete.
func TestMayRecycle(t *testing.T) {
	n := testNode()
	n.backends = map[string]backend.Backend{warmBackend: nil}
	w := &warmPools{n: n, size: 2, recycle: 4}
	rec, err := n.admit(CreateRequest{Project: "p"})
	if err != nil {
		t.Fatal(err)
	}
	rec.Phase = state.PhaseRunning
	alive := idleSandbox{done: make(chan struct{})}
	recycler := recyclingSandbox{idleSandbox: alive}
	if !w.mayRecycle(rec, recycler) {
		t.Fatal("a running default sandbox is not recycled")
	}
	if w.mayRecycle(rec, alive) {
		t.Error("a sandbox that cannot be recycled is")
	}
	paused, reclaimed, big := *rec, *rec, *rec
	paused.Phase = state.PhasePaused
	reclaimed.Reclaimed = true
	big.MemoryBytes *= 2
	for name, r := range map[string]*state.Record{"paused": &paused, "reclaimed": &reclaimed, "own memory limit": &big} {
		if w.mayRecycle(r, recycler) {
			t.Errorf("%s: recycled", name)
		}
	}
	if (&warmPools{n: n, size: 2}).mayRecycle(rec, recycler) {
		t.Error("recycled on a node without --recycle")
	}
	if !(&warmPools{n: n, recycle: 1}).recyclable(rec) {
		t.Error("--warm-pool 0 --recycle 1 makes no recyclable sandboxes")
	}
}
