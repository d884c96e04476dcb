package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// snapshotOf is a snapshot of ready nodes with the given sandbox counts,
// each with room for capa sandboxes, measured at asOf.
func snapshotOf(counts []int64, capa int64, asOf time.Time) *Snapshot {
	s := &Snapshot{byID: map[string]*NodeView{}}
	for i, n := range counts {
		v := &NodeView{State: NodeReady, NodeRecord: NodeRecord{ID: fmt.Sprintf("n%03d", i), Backends: []string{"container"},
			Capacity: Capacity{Sandboxes: capa}, Load: Load{Sandboxes: n}, AsOf: asOf}}
		s.Nodes = append(s.Nodes, v)
		s.byID[v.ID] = v
	}
	return s
}

// TestPowerOfTwoSamplesDistinctNodes: the two candidates of a placement
// are two different nodes, so the most loaded of three is never chosen.
func TestPowerOfTwoSamplesDistinctNodes(t *testing.T) {
	snap := snapshotOf([]int64{0, 0, 90}, 100, time.Now())
	p := NewPlacer(PlacerConfig{K: 2}, func() *Snapshot { return snap })
	for range 2000 {
		pl, err := p.Place(Want{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if pl.Node.ID == "n002" {
			t.Fatal("power of 2 chose the most loaded of three nodes: it sampled one node twice")
		}
		pl.Done(false)
	}
}

// TestOverlaySpreadsBetweenReports: with no report in between, the
// placements a control instance made itself keep the nodes even; a report
// measured after them replaces them, and one measured before does not.
func TestOverlaySpreadsBetweenReports(t *testing.T) {
	asOf := time.Now()
	snap := snapshotOf(make([]int64, 16), 1000, asOf)
	p := NewPlacer(PlacerConfig{K: 2}, func() *Snapshot { return snap })
	placed := map[string]int64{}
	for range 1600 {
		pl, err := p.Place(Want{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		placed[pl.Node.ID]++
		pl.Done(true)
	}
	for id, n := range placed {
		if n < 80 || n > 120 {
			t.Fatalf("node %s got %d of 1600 placements over 16 nodes; want 100 ± 20 (%v)", id, n, placed)
		}
	}
	// n000 reports 1000 sandboxes (full) measured after the placements:
	// the overlay of n000 is dropped and the report counts.
	full := snapshotOf(make([]int64, 16), 1000, asOf)
	full.Nodes[0].Load.Sandboxes, full.Nodes[0].AsOf = 1000, time.Now()
	snap = full
	for range 200 {
		pl, err := p.Place(Want{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if pl.Node.ID == "n000" {
			t.Fatal("placed on a node whose report says it is full")
		}
		pl.Done(false)
	}
	// A report older than the placements: they still count on top of it.
	p.mu.Lock()
	l := p.estimateLocked(snap.Nodes[1])
	p.mu.Unlock()
	if l.Sandboxes != placed["n001"] {
		t.Fatalf("n001's estimate before any newer report: %d; want its %d placements", l.Sandboxes, placed["n001"])
	}
}

// BenchmarkPlace is one placement and its Done over 160 nodes.
func BenchmarkPlace(b *testing.B) {
	for _, k := range []int{2, 1, 0} {
		b.Run(fmt.Sprintf("k=%d", k), func(b *testing.B) {
			snap := snapshotOf(make([]int64, 160), 1<<40, time.Now())
			p := NewPlacer(PlacerConfig{K: k}, func() *Snapshot { return snap })
			b.ReportAllocs()
			for b.Loop() {
				pl, err := p.Place(Want{}, nil)
				if err != nil {
					b.Fatal(err)
				}
				pl.Done(false)
			}
		})
	}
}

// TestFilterFollowsSnapshot: the remembered filter is the current
// snapshot's; excluded nodes and node labels are never answered from it.
func TestFilterFollowsSnapshot(t *testing.T) {
	snap := snapshotOf([]int64{0, 5}, 100, time.Now())
	p := NewPlacer(PlacerConfig{K: 0}, func() *Snapshot { return snap })
	pl, err := p.Place(Want{}, nil)
	if err != nil || pl.Node.ID != "n000" {
		t.Fatalf("least loaded of two: %v, %v; want n000", pl, err)
	}
	pl.Done(false)
	next := snapshotOf([]int64{0, 5}, 100, time.Now())
	next.Nodes[0].State = NodeDrained
	snap = next
	for range 20 {
		pl, err := p.Place(Want{}, nil)
		if err != nil || pl.Node.ID != "n001" {
			t.Fatalf("with n000 drained: %v, %v; want n001", pl, err)
		}
		pl.Done(false)
	}
	_, err = p.Place(Want{}, map[string]string{"n001": "refused: full"})
	if err == nil || !strings.Contains(err.Error(), "n000: drained") || !strings.Contains(err.Error(), "n001: refused: full") {
		t.Fatalf("n001 excluded: %v; want both nodes' reasons", err)
	}
	if _, err := p.Place(Want{NodeLabels: map[string]string{"gpu": "a100"}}, nil); err == nil || !strings.Contains(err.Error(), "n001: label gpu=a100") {
		t.Fatalf("a label no node has: %v; want n001's reason", err)
	}
	if pl, err := p.Place(Want{}, nil); err != nil || pl.Node.ID != "n001" {
		t.Fatalf("plain create after the others: %v, %v; want n001", pl, err)
	}
}

// TestReserveOnOneNode: forks reserved on their parent's node count like
// placements there: up to its capacity, the rest refused naming the node;
// a refused or failed fork frees its share, an admitted one stays until a
// report covers it; a drained node takes none.
func TestReserveOnOneNode(t *testing.T) {
	snap := snapshotOf([]int64{7, 0}, 10, time.Now())
	p := NewPlacer(PlacerConfig{}, func() *Snapshot { return snap })
	pls, err := p.Reserve("n000", Want{}, 5)
	if len(pls) != 3 || err == nil || !strings.Contains(err.Error(), "node n000 is full") {
		t.Fatalf("reserve 5 on a node with room for 3: %d, %v", len(pls), err)
	}
	pls[0].Done(false)
	pls[1].Done(true)
	pls[2].Done(true)
	if more, err := p.Reserve("n000", Want{}, 2); len(more) != 1 || err == nil {
		t.Fatalf("after 2 of 3 admitted, reserve 2: %d, %v; want 1", len(more), err)
	}
	if pl, err := p.Place(Want{}, nil); err != nil || pl.Node.ID != "n001" {
		t.Fatalf("a create after the forks filled n000: %v, %v; want n001", pl, err)
	}
	snap.Node("n001").State = NodeDrained
	if pls, err := p.Reserve("n001", Want{}, 1); len(pls) != 0 || err == nil || !strings.Contains(err.Error(), "drained") {
		t.Fatalf("reserve on a drained node: %d, %v", len(pls), err)
	}
}
