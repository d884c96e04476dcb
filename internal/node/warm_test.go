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
	w := &warmPools{n: n, size: 2, held: map[string]int{}}
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
	recycling := &warmPools{n: n, recycle: 4, held: map[string]int{}}
	for name, req := range map[string]CreateRequest{
		"memory":      {Resources: Resources{MemoryBytes: 256 * mib}},
		"cpu":         {Resources: Resources{CPUMillis: 500}},
		"disk":        {Resources: Resources{DiskBytes: 2 * gib}},
		"pids":        {Resources: Resources{Pids: 100}},
		"best effort": {Resources: Resources{BestEffort: true}},
		"io":          {Resources: Resources{IO: state.IOLimits{WriteIOPS: 10}}},
	} {
		rec := admit(req)
		if w.matches(rec) {
			t.Errorf("%s: served from the pool", name)
		}
		// Recycled sandboxes are made with the create's own resources.
		if !recycling.recyclable(rec) {
			t.Errorf("%s: not made recyclable on a recycling node", name)
		}
	}
	for name, req := range map[string]CreateRequest{
		"network": {Network: backend.Network{Mode: "allowlist"}},
		"microvm": {Backend: "microvm"},
		"fresh":   {Fresh: true},
	} {
		rec := admit(req)
		if w.matches(rec) || recycling.recyclable(rec) {
			t.Errorf("%s: served from the pool or made recyclable", name)
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

// recyclingSandbox also implements backend.Recycler, made recyclable.
type recyclingSandbox struct {
	idleSandbox
	backend.Recycler
}

func (recyclingSandbox) Recyclable() bool { return true }

// TestRecycledSandboxesStayInTheirProject: a create takes a sandbox made
// ahead of demand (only with the default resources) or one recycled from
// its own project's deletes with its resources, never one another project
// used.
func TestRecycledSandboxesStayInTheirProject(t *testing.T) {
	n := testNode()
	w := &warmPools{n: n, size: 1, recycle: 4, pools: map[string]*warmPool{}, held: map[string]int{}}
	alive := idleSandbox{done: make(chan struct{})}
	def, big := backend.Resources{MemoryBytes: 128 * mib}, backend.Resources{MemoryBytes: 256 * mib}
	fromA := &warmSandbox{id: "n-a", sb: alive, recycled: true, project: "a", res: def}
	bigFromA := &warmSandbox{id: "n-a-big", sb: alive, recycled: true, project: "a", res: big}
	made := &warmSandbox{id: "n-made", sb: alive, res: def}
	fromB := &warmSandbox{id: "n-b", sb: alive, recycled: true, project: "b", res: def}
	w.pools["busybox"] = &warmPool{image: "busybox", ready: []*warmSandbox{fromA, bigFromA, made, fromB}, wake: make(chan struct{}, 1)}
	for _, step := range []struct {
		project string
		res     backend.Resources
		made    bool // the create asks for the default resources
		want    *warmSandbox
	}{
		{"b", def, true, fromB}, {"b", big, false, nil}, {"c", def, true, made}, {"c", def, true, nil}, {"", def, true, nil},
		{"a", big, false, bigFromA}, {"a", big, false, nil}, {"a", def, true, fromA},
	} {
		if got := w.take("busybox", step.project, step.res, step.made); got != step.want {
			t.Fatalf("project %q with %+v took %+v, want %+v", step.project, step.res, got, step.want)
		}
	}
}

// TestMayRecycle: only a running, recyclable sandbox (network none, any
// resources) on a recycling node is recycled by its delete.
func TestMayRecycle(t *testing.T) {
	n := testNode()
	n.backends = map[string]backend.Backend{warmBackend: nil}
	w := &warmPools{n: n, size: 2, recycle: 4, held: map[string]int{}}
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
	paused, reclaimed, big, networked := *rec, *rec, *rec, *rec
	paused.Phase = state.PhasePaused
	reclaimed.Reclaimed = true
	big.MemoryBytes *= 2
	networked.NetworkMode, networked.NetworkAllow = "allowlist", []string{"example.com"}
	if !w.mayRecycle(&big, recycler) {
		t.Error("a running sandbox with its own memory limit is not recycled")
	}
	for name, r := range map[string]*state.Record{"paused": &paused, "reclaimed": &reclaimed, "network": &networked} {
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

// TestBoundRecyclable: on a node that bounds its recyclable sandboxes (the
// init stub's), an image has at most Recycle of them in use or pooled; a
// create beyond makes a plain sandbox, and a deleted one's place is taken
// again.
func TestBoundRecyclable(t *testing.T) {
	n := testNode()
	n.backends = map[string]backend.Backend{warmBackend: nil}
	w := &warmPools{n: n, recycle: 2, bound: true, pools: map[string]*warmPool{}, held: map[string]int{}}
	rec, err := n.admit(CreateRequest{Project: "p"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if !w.claim(rec) {
			t.Fatalf("create %d of 2 is not made recyclable", i+1)
		}
	}
	if w.claim(rec) {
		t.Fatal("a third create is made recyclable with two held and --recycle 2")
	}
	other, err := n.admit(CreateRequest{Image: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	if !w.claim(other) {
		t.Error("another image's create is bounded by busybox's")
	}
	w.unclaim(rec.Image)
	if !w.claim(rec) {
		t.Fatal("a create is not made recyclable after a held one was deleted")
	}
	w.unclaim(rec.Image)
	alive := idleSandbox{done: make(chan struct{})}
	w.pools["busybox"] = &warmPool{image: "busybox", ready: []*warmSandbox{{id: "n-made", sb: recyclingSandbox{idleSandbox: alive}}}}
	if w.claim(rec) {
		t.Error("a create is made recyclable with one held and one made ahead")
	}
	unbound := &warmPools{n: n, recycle: 2, held: map[string]int{}}
	for i := range 3 {
		if !unbound.claim(rec) {
			t.Errorf("create %d: not made recyclable on a node that does not bound them", i+1)
		}
	}
}
