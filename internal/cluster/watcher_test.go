package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/etcdembed"
)

// TestWatcherSharesUnchangedViews: a report of one node publishes a
// snapshot where that node's view is new and every other node's is the
// previous snapshot's; drain, record loss (lost, with its reason) and a
// member forgotten show in the next snapshots. Ports 17310-17311.
func TestWatcherSharesUnchangedViews(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := etcdembed.StartCluster(ctx, t.TempDir(), 1, 17310, true)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cli, err := Dial(e.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	put := func(key, value string) {
		t.Helper()
		if _, err := cli.Put(ctx, key, value); err != nil {
			t.Fatal(err)
		}
	}
	report := func(id string, sandboxes int64) {
		put(nodesPrefix+id, marshal(NodeRecord{ID: id, Address: id + ":1", Backends: []string{"container"}, Load: Load{Sandboxes: sandboxes}}))
	}
	for _, id := range []string{"n3", "n1", "n2"} {
		put(membersPrefix+id, marshal(MemberRecord{ID: id, Address: id + ":1"}))
		report(id, 0)
	}
	w, err := StartWatcher(ctx, cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	s0 := w.Snapshot()
	if len(s0.Nodes) != 3 || s0.Nodes[0].ID != "n1" || s0.Nodes[2].ID != "n3" {
		t.Fatalf("first snapshot: %d nodes %v; want n1, n2, n3 in order", len(s0.Nodes), s0.Nodes)
	}
	wait := func(what string, cond func(*Snapshot) bool) *Snapshot {
		t.Helper()
		if err := w.WaitFor(ctx, cond); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return w.Snapshot()
	}

	report("n2", 7)
	s1 := wait("n2's report", func(s *Snapshot) bool { return s.Node("n2").Load.Sandboxes == 7 })
	if s1.Node("n1") != s0.Node("n1") || s1.Node("n3") != s0.Node("n3") || s1.Node("n2") == s0.Node("n2") {
		t.Fatal("a report of n2 rebuilt other nodes' views (or not n2's)")
	}
	if s0.Node("n2").Load.Sandboxes != 0 {
		t.Fatal("an earlier snapshot changed")
	}

	put(drainPrefix+"n1", "now")
	wait("drain", func(s *Snapshot) bool { return s.Node("n1").State == NodeDrained })
	if _, err := cli.Delete(ctx, nodesPrefix+"n3"); err != nil {
		t.Fatal(err)
	}
	s3 := wait("n3's record gone", func(s *Snapshot) bool { return s.Node("n3").State == NodeLost })
	if s3.Node("n3").Reason == "" || s3.Nodes[2] != s3.Node("n3") {
		t.Fatalf("lost n3: %+v; want a reason, still third", s3.Node("n3"))
	}
	if _, err := cli.Delete(ctx, membersPrefix+"n3"); err != nil {
		t.Fatal(err)
	}
	s4 := wait("n3 forgotten", func(s *Snapshot) bool { return s.Node("n3") == nil })
	if len(s4.Nodes) != 2 || s4.Nodes[0].ID != "n1" || s4.Nodes[1].ID != "n2" || s4.Node("n1").State != NodeDrained {
		t.Fatalf("after forgetting n3: %v; want drained n1, then n2", s4.Nodes)
	}
}
