package node

import (
	"testing"

	"github.com/corral-dev/corral/internal/state"
)

// TestReclaimedSandboxCountsItsResidentMemory: admission sees a reclaimed
// sandbox with what it still holds in RAM, not its limit.
func TestReclaimedSandboxCountsItsResidentMemory(t *testing.T) {
	n := &Node{sandboxes: map[string]*entry{
		"r": {rec: &state.Record{ID: "r", Phase: state.PhasePaused, MemoryBytes: 1 << 30, Reclaimed: true, ReclaimedResident: 2 << 20}},
		"p": {rec: &state.Record{ID: "p", Phase: state.PhasePaused, MemoryBytes: 1 << 30}},
		"s": {rec: &state.Record{ID: "s", Phase: state.PhaseStopped, MemoryBytes: 1 << 30}},
	}, pending: map[*state.Record]state.Record{}}
	got := map[string]int64{}
	for _, rec := range n.LiveRecords() {
		got[rec.ID] = rec.MemoryBytes
	}
	if len(got) != 2 || got["r"] != 2<<20 || got["p"] != 1<<30 {
		t.Fatalf("admission's memory per sandbox: %v, want r at 2 MiB, p at its 1 GiB limit, s not counted", got)
	}
	if n.sandboxes["r"].rec.MemoryBytes != 1<<30 {
		t.Fatal("LiveRecords changed the record itself")
	}
}

func TestCheckIdleAction(t *testing.T) {
	for _, a := range []string{"", "stop", "pause", "reclaim"} {
		if err := checkIdleAction(a); err != nil {
			t.Errorf("%q: %v", a, err)
		}
	}
	if err := checkIdleAction("sleep"); err == nil {
		t.Error(`"sleep" accepted`)
	}
}
