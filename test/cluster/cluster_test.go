package cluster_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
)

func nodeOf(id string) string { n, _, _ := strings.Cut(id, "-"); return n }

var small = client.Resources{MemoryBytes: 32 << 20}

// createMany makes n sandboxes, 8 at a time, alternating control
// instances; mk builds each create's options.
func createMany(t *testing.T, r *rig, n int, mk func(i int) client.CreateOptions) []string {
	t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				sb, err := r.cli[i%len(r.cli)].Create(context.Background(), mk(i))
				if err != nil {
					t.Errorf("create %d: %v", i, err)
					continue
				}
				ids[i] = sb.ID()
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return ids
}

func run(t *testing.T, c *client.Client, id, word string) {
	t.Helper()
	res, err := c.Sandbox(id).Run(context.Background(), client.Command{Args: []string{"echo", word}})
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != word {
		t.Fatalf("run in %s: %+v, %v", id, res, err)
	}
}

func TestCluster(t *testing.T) {
	r := startRig(t, true, 2, 3)
	ctx := context.Background()
	nodes := r.waitNodes(3, "ready")
	nodeIDs := []string{nodes[0].ID, nodes[1].ID, nodes[2].ID}

	// 300 creates through alternating control instances spread over all
	// three nodes.
	ids := createMany(t, r, 300, func(int) client.CreateOptions {
		return client.CreateOptions{Resources: small, Labels: map[string]string{"phase": "spread"}}
	})
	per := map[string]int{}
	for _, id := range ids {
		per[nodeOf(id)]++
	}
	for _, n := range nodeIDs {
		if per[n] < 60 {
			t.Fatalf("node %s got %d of 300 (want at least 20%%): %v", n, per[n], per)
		}
	}
	t.Logf("300 creates per node: %v", per)

	// Every sandbox answers through either control instance.
	for i, id := range ids {
		run(t, r.cli[i%2], id, "hi")
		if _, err := r.cli[(i+1)%2].Get(ctx, id); err != nil {
			t.Fatalf("get %s through the other instance: %v", id, err)
		}
	}
	listed, err := r.cli[1].List(ctx, client.ListOptions{Labels: map[string]string{"phase": "spread"}, PageSize: 64})
	if err != nil || len(listed) != 300 {
		t.Fatalf("cluster-wide List with a label filter: %d, %v; want 300", len(listed), err)
	}

	// One etcd member killed: the service continues.
	r.kill9(r.etcd[2])
	more := createMany(t, r, 20, func(int) client.CreateOptions { return client.CreateOptions{Resources: small} })
	for _, id := range more {
		run(t, r.cli[1], id, "etcd-down")
	}

	// Function calls go to a node too.
	for i := range 4 {
		res, err := r.cli[i%2].Call(ctx, client.CallOptions{Language: "sh", Source: "echo called", WallTimeout: 30 * time.Second})
		if err != nil || res.Verdict != client.VerdictOK || strings.TrimSpace(string(res.Stdout)) != "called" {
			t.Fatalf("fncall through the control plane: %+v, %v", res, err)
		}
	}

	// Streamed stdin through either control instance.
	for i := range 2 {
		execStream(t, r.cli[i], ids[i])
	}

	t.Run("project quota over the nodes", func(t *testing.T) { clusterQuota(t, r) })
	t.Run("control killed mid-burst", func(t *testing.T) { controlCrash(t, r) })
	t.Run("node killed", func(t *testing.T) { nodeCrash(t, r, ids) })
	t.Run("control restarted", func(t *testing.T) { controlRestart(t, r, ids) })
}

// controlRestart: a new control instance on the killed one's address
// rebuilds its view of the nodes (state and load) from etcd alone and
// routes to every sandbox.
func controlRestart(t *testing.T, r *rig, ids []string) {
	r.start(r.control[0])
	addr := fmt.Sprintf("127.0.0.1:%d", controlBase)
	waitPort(t, addr, r.control[0])
	c, err := client.New("unix://" + r.controlSocket(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nodes, err := c.ClusterNodes(context.Background())
	if err != nil || len(nodes) != 3 {
		t.Fatalf("restarted control: nodes %+v, %v", nodes, err)
	}
	for _, n := range nodes {
		if n.State != "ready" || n.Sandboxes == 0 {
			t.Fatalf("restarted control sees node %s %s with %d sandboxes", n.ID, n.State, n.Sandboxes)
		}
	}
	for _, id := range ids[:30] {
		run(t, c, id, "again")
	}
}

// controlCrash: control 0 is killed with SIGKILL during a burst of
// creates, each sent at once to both control instances with the same
// client request id and no retry flag (as a client racing two instances
// would). Every request id ends with exactly one sandbox, and every answer
// names it: control 1 waits while control 0 places a request, and takes
// the request over on the node control 0 chose once control 0 is gone.
func controlCrash(t *testing.T, r *rig) {
	ctx := context.Background()
	const n = 80
	var wg sync.WaitGroup
	var cut atomic.Int32
	made := make([][2]string, n)
	errs := make(chan error, n)
	for i := range n {
		if i == n/2 {
			r.kill9(r.control[0])
		}
		for j := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				o := client.CreateOptions{Resources: small, Labels: map[string]string{"phase": "crash"},
					Placement: client.Placement{RequestID: fmt.Sprintf("burst-%d", i)}}
				cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
				defer cancel()
				sb, err := r.cli[j].Create(cctx, o)
				switch {
				case err == nil:
					made[i][j] = sb.ID()
				case j == 0 && client.IsUnavailable(err):
					cut.Add(1) // control 0 was killed: its answers are lost
				default:
					errs <- fmt.Errorf("request %d through control %d: %w", i, j, err)
				}
			}()
		}
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	listed, err := r.cli[1].List(ctx, client.ListOptions{Labels: map[string]string{"phase": "crash"}})
	if err != nil {
		t.Fatal(err)
	}
	byReq := map[string][]string{}
	for _, in := range listed {
		rid := in.Labels["corral.request-id"]
		byReq[rid] = append(byReq[rid], in.ID)
	}
	if len(listed) != n || len(byReq) != n {
		t.Fatalf("%d sandboxes for %d request ids after the crash (want %d each): %v", len(listed), len(byReq), n, byReq)
	}
	t.Logf("%d of %d creates through control 0 cut off by the kill", cut.Load(), n)
	if cut.Load() == 0 {
		t.Fatal("no create was cut off by the crash: the test did not test it")
	}
	for i, ids := range made {
		got := byReq[fmt.Sprintf("burst-%d", i)]
		if len(got) != 1 || got[0] != ids[1] || (ids[0] != "" && ids[0] != ids[1]) {
			t.Fatalf("request %d: answered %v, cluster has %v", i, ids, got)
		}
	}
}

// nodeCrash: a node killed with SIGKILL: its sandboxes are reported lost
// within the lease TTL (3s) and calls to them fail Unavailable naming it;
// creates go on elsewhere; back on the same data dir, its sandboxes answer.
func nodeCrash(t *testing.T, r *rig, ids []string) {
	ctx := context.Background()
	c := r.cli[1]
	victim := r.nodes[2]
	var mine []string
	nodes, _ := c.ClusterNodes(ctx)
	var victimID string
	for _, n := range nodes {
		if n.Address == r.nodeAddr(2) {
			victimID = n.ID
		}
	}
	for _, id := range ids {
		if nodeOf(id) == victimID {
			mine = append(mine, id)
		}
	}
	if len(mine) == 0 {
		t.Fatal("the victim node has no sandboxes")
	}
	killed := time.Now()
	r.kill9(victim)
	for {
		in, err := c.Get(ctx, mine[0])
		if err == nil && in.State == client.StateLost {
			if !strings.Contains(in.StopReason, victimID) {
				t.Fatalf("lost reason %q does not name node %s", in.StopReason, victimID)
			}
			t.Logf("lost after %v (lease TTL 3s)", time.Since(killed).Round(10*time.Millisecond))
			break
		}
		if time.Since(killed) > 15*time.Second {
			t.Fatalf("sandbox of the killed node after 15s: %+v, %v", in, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := c.Sandbox(mine[0]).Run(ctx, client.Command{Args: []string{"true"}}); !client.IsUnavailable(err) || !strings.Contains(err.Error(), victimID) {
		t.Fatalf("run on a lost node's sandbox: %v; want unavailable naming %s", err, victimID)
	}
	// List shows them, from the node's last summary in etcd, lost with
	// the reason.
	listed, err := c.ListCluster(ctx, client.ListOptions{Labels: map[string]string{"phase": "spread"}})
	if err != nil || len(listed.UnavailableNodes) != 1 {
		t.Fatalf("List with node %s lost: %+v, %v", victimID, listed, err)
	}
	lost := map[string]bool{}
	for _, in := range listed.Sandboxes {
		if nodeOf(in.ID) != victimID {
			continue
		}
		if in.State != client.StateLost || !strings.Contains(in.StopReason, victimID) {
			t.Fatalf("List shows %s of the lost node as %s (%q); want lost naming %s", in.ID, in.State, in.StopReason, victimID)
		}
		lost[in.ID] = true
	}
	for _, id := range mine {
		if !lost[id] {
			t.Fatalf("List does not show %s of the lost node", id)
		}
	}
	r.cli = r.cli[1:] // control 0 was killed above
	for _, id := range createMany(t, r, 20, func(int) client.CreateOptions { return client.CreateOptions{Resources: small} }) {
		if nodeOf(id) == victimID {
			t.Fatalf("create placed on the lost node")
		}
	}
	// Back on the same data dir: re-registers, its sandboxes answer.
	r.start(victim)
	r.waitNodes(3, "ready")
	for _, id := range mine {
		run(t, c, id, "back")
	}
}
