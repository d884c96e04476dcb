package cluster_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/cluster/simnode"
	"github.com/corral-dev/corral/internal/etcdembed"
	"github.com/corral-dev/corral/internal/server"
)

// Ports 17502-17509 (CORRAL_CLUSTER_UNIT_PORT moves them): etcd +0 and +1,
// the simulated nodes +2, control instances +3 and +4.
var portBase = func() int {
	if n, err := strconv.Atoi(os.Getenv("CORRAL_CLUSTER_UNIT_PORT")); err == nil {
		return n
	}
	return 17502
}()

var secret = cluster.Secret("test-cluster-secret-0123456789")

type rig struct {
	etcd  *etcdembed.Cluster
	fleet *simnode.Fleet
	ctl   []*server.Control
	cli   []*client.Client
	sock  []string // each control instance's unix socket
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startRig starts a real etcd, the simulated nodes and n control instances
// (with placer config pc), and waits until every control sees every node.
func startRig(t *testing.T, specs []simnode.Spec, n int, pc cluster.PlacerConfig) *rig {
	t.Helper()
	ctx := context.Background()
	e, err := etcdembed.StartCluster(ctx, t.TempDir(), 1, portBase, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	f, err := simnode.Start(ctx, fmt.Sprintf("127.0.0.1:%d", portBase+2), e.Endpoints(), secret, specs, 2*time.Second, 200*time.Millisecond, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(context.Background()) })
	r := &rig{etcd: e, fleet: f}
	for i := range n {
		// The socket's caller is the cluster administrator (TCP wants a token).
		sock := filepath.Join(t.TempDir(), "control.sock")
		c, err := server.StartControl(ctx, server.ControlConfig{Etcd: e.Endpoints(), Secret: secret,
			Listen: fmt.Sprintf("127.0.0.1:%d", portBase+3+i), Socket: sock, Placer: pc, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Stop(context.Background()) })
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = c.Watcher().WaitFor(wctx, func(s *cluster.Snapshot) bool { return len(s.Nodes) == len(specs) })
		cancel()
		if err != nil {
			t.Fatalf("control %d sees %d of %d nodes", i, len(c.Watcher().Snapshot().Nodes), len(specs))
		}
		cl, err := client.New("unix://" + sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		r.ctl, r.cli, r.sock = append(r.ctl, c), append(r.cli, cl), append(r.sock, sock)
	}
	return r
}

func nodeOf(id string) string { n, _, _ := strings.Cut(id, "-"); return n }

func specs(n int, capa int64) []simnode.Spec {
	var out []simnode.Spec
	for i := range n {
		out = append(out, simnode.Spec{ID: simnode.NodeID(i), Capacity: cluster.Capacity{Sandboxes: capa}})
	}
	return out
}

// slowRig is two control instances over three roomy nodes that each
// answer after latency, creates placed with K=2.
func slowRig(t *testing.T, latency time.Duration) *rig {
	sp := specs(3, 1000)
	for i := range sp {
		sp[i].Latency = latency
	}
	return startRig(t, sp, 2, cluster.PlacerConfig{K: 2})
}

// TestRefusingNodeIsSkipped: a node that advertises room but refuses at
// admission gets no sandbox; every create succeeds elsewhere; a create only
// that node could take fails naming each node's reason.
func TestRefusingNodeIsSkipped(t *testing.T) {
	sp := specs(3, 1000)
	sp[2].Refuse = "gpu memory: 0 of 0 bytes free"
	sp[2].Labels = map[string]string{"gpu": "true"}
	r := startRig(t, sp, 1, cluster.PlacerConfig{K: 2})
	ctx := context.Background()
	for i := range 60 {
		if _, err := r.cli[0].Create(ctx, client.CreateOptions{}); err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
	}
	nodes := r.fleet.Nodes()
	if nodes[2].Live() != 0 || nodes[0].Live()+nodes[1].Live() != 60 {
		t.Fatalf("live per node %d %d %d, want the refusing node empty and 60 on the others", nodes[0].Live(), nodes[1].Live(), nodes[2].Live())
	}
	_, err := r.cli[0].Create(ctx, client.CreateOptions{Placement: client.Placement{NodeLabels: map[string]string{"gpu": "true"}}})
	if !client.IsResourceExhausted(err) {
		t.Fatalf("create only the refusing node fits: %v, want resource exhausted", err)
	}
	for _, want := range []string{"sim002: node admission: gpu memory", "sim000: label gpu=true", "sim001: label gpu=true"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// TestBurstPool: burst nodes take only burst-ok creates, and only while the
// primary pool is above the threshold.
func TestBurstPool(t *testing.T) {
	sp := specs(3, 10)
	sp[2].Labels = map[string]string{"pool": "burst"}
	sp[2].Capacity.Sandboxes = 100
	r := startRig(t, sp, 1, cluster.PlacerConfig{K: 0, BurstThreshold: 0.8})
	ctx := context.Background()
	burst := r.fleet.Nodes()[2]
	// Up to 80% of the primary pool's 20: burst-ok or not, nothing on burst.
	for i := range 16 {
		if _, err := r.cli[0].Create(ctx, client.CreateOptions{Placement: client.Placement{BurstOK: i%2 == 0}}); err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
	}
	if burst.Live() != 0 {
		t.Fatalf("burst node has %d sandboxes with the primary pool at or below 80%%", burst.Live())
	}
	// Above the threshold, creates that do not allow it stay primary...
	for i := range 3 {
		sb, err := r.cli[0].Create(ctx, client.CreateOptions{})
		if err != nil {
			t.Fatalf("primary create %d: %v", i, err)
		}
		if nodeOf(sb.ID()) == burst.ID {
			t.Fatalf("a create without burst_ok went to the burst pool")
		}
	}
	// ...and burst-ok ones may go to the (emptier) burst pool.
	sb, err := r.cli[0].Create(ctx, client.CreateOptions{Placement: client.Placement{BurstOK: true}})
	if err != nil {
		t.Fatal(err)
	}
	if nodeOf(sb.ID()) != burst.ID {
		t.Fatalf("burst-ok create above the threshold went to %s, not the burst node", nodeOf(sb.ID()))
	}
	// The primary pool has 1 left: take it, then a non-burst create fails
	// and says why the burst node was passed over.
	if _, err := r.cli[0].Create(ctx, client.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = r.cli[0].Create(ctx, client.CreateOptions{})
	if !client.IsResourceExhausted(err) || !strings.Contains(err.Error(), "does not allow it") {
		t.Fatalf("create with the primary pool full: %v", err)
	}
}

// TestDrainLostAndPagination: a drained node gets no placements; a node
// that stops renewing is lost (its sandboxes LOST with the reason, calls
// Unavailable naming it) while creates go on elsewhere; a paged List is
// complete and without duplicates while that node goes away.
func TestDrainLostAndPagination(t *testing.T) {
	r := startRig(t, specs(3, 1000), 2, cluster.PlacerConfig{K: 2})
	ctx := context.Background()
	if _, err := r.cli[0].DrainNode(ctx, "sim001", false); err != nil {
		t.Fatal(err)
	}
	// The other instance sees the drain through etcd.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.ctl[1].Watcher().WaitFor(wctx, func(s *cluster.Snapshot) bool { return s.Node("sim001").State == cluster.NodeDrained }); err != nil {
		t.Fatal("second control instance never saw the drain")
	}
	for i := range 30 {
		sb, err := r.cli[i%2].Create(ctx, client.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if nodeOf(sb.ID()) == "sim001" {
			t.Fatalf("create %d placed on the drained node", i)
		}
	}
	if _, err := r.cli[1].DrainNode(ctx, "sim001", true); err != nil {
		t.Fatal(err)
	}
	for range 30 {
		if _, err := r.cli[1].Create(ctx, client.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if r.fleet.Nodes()[1].Live() == 0 {
		t.Fatal("undrained node got no placements")
	}

	// sim002's summary in etcd lists every sandbox it has before it dies.
	waitSummary(t, r, "sim002", r.fleet.Nodes()[2].Live())
	// Page through (page size 7) and kill sim002 half way.
	seen := map[string]bool{}
	var lostID string
	tok := ""
	for page := 0; ; page++ {
		infos, next, err := listPage(ctx, r.sock[page%2], tok, 7)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			if seen[in.Id] {
				t.Fatalf("page %d repeats %s", page, in.Id)
			}
			seen[in.Id] = true
			if nodeOf(in.Id) == "sim002" {
				lostID = in.Id
			}
		}
		if page == 3 {
			r.fleet.Nodes()[2].Kill()
		}
		if next == "" {
			break
		}
		tok = next
	}
	if len(seen) < 40 {
		t.Fatalf("paged List saw %d sandboxes", len(seen))
	}
	if lostID == "" {
		t.Fatal("no sandbox of sim002 listed before it was killed")
	}
	// Within the lease TTL (2s) both instances report it lost.
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, err := r.cli[1].Get(ctx, lostID)
		if err == nil && in.State == client.StateLost {
			if !strings.Contains(in.StopReason, "sim002") {
				t.Fatalf("lost reason %q does not name the node", in.StopReason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox of the killed node: %+v, %v; want lost", in, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, err := r.cli[0].Sandbox(lostID).Run(ctx, client.Command{Args: []string{"true"}})
	if !client.IsUnavailable(err) || !strings.Contains(err.Error(), "sim002") {
		t.Fatalf("exec on a lost node's sandbox: %v, want unavailable naming sim002", err)
	}
	for range 20 {
		sb, err := r.cli[0].Create(ctx, client.CreateOptions{})
		if err != nil {
			t.Fatalf("create after a node was lost: %v", err)
		}
		if nodeOf(sb.ID()) == "sim002" {
			t.Fatal("placed on a lost node")
		}
	}
	// List names the lost node unavailable and shows its sandboxes, as its
	// last summary had them, lost with the reason; a page token crosses
	// into and out of the lost node (page size 3).
	list, err := r.cli[1].ListCluster(ctx, client.ListOptions{PageSize: 3})
	if err != nil || len(list.UnavailableNodes) != 1 || !strings.Contains(list.UnavailableNodes[0], "sim002") {
		t.Fatalf("List with a lost node: %+v, %v; want sim002 named unavailable", list, err)
	}
	lost := 0
	for _, in := range list.Sandboxes {
		if nodeOf(in.ID) == "sim002" {
			if in.State != client.StateLost || !strings.Contains(in.StopReason, "sim002") {
				t.Fatalf("List shows %s of the lost node as %s (%q), want lost naming the node", in.ID, in.State, in.StopReason)
			}
			lost++
		}
	}
	if want := r.fleet.Nodes()[2].Live(); lost != want || want == 0 {
		t.Fatalf("List shows %d sandboxes of the lost node, which had %d", lost, want)
	}
	if len(list.Sandboxes) != r.fleet.Nodes()[0].Live()+r.fleet.Nodes()[1].Live()+lost {
		t.Fatalf("List has %d sandboxes, the nodes %d", len(list.Sandboxes), r.fleet.Nodes()[0].Live()+r.fleet.Nodes()[1].Live()+lost)
	}
	onlyLost, err := r.cli[0].List(ctx, client.ListOptions{State: client.StateLost})
	if err != nil || len(onlyLost) != lost {
		t.Fatalf("List state=lost: %d, %v; want %d", len(onlyLost), err, lost)
	}
	running, err := r.cli[0].List(ctx, client.ListOptions{State: client.StateRunning})
	if err != nil || len(running) != len(list.Sandboxes)-lost {
		t.Fatalf("List state=running: %d, %v; want %d", len(running), err, len(list.Sandboxes)-lost)
	}
	if in, err := r.cli[0].Get(ctx, onlyLost[0].ID); err != nil || in.State != client.StateLost || in.CreatedAt.IsZero() {
		t.Fatalf("get of a lost sandbox: %+v, %v; want lost with its creation time from the summary", in, err)
	}
	nodes, err := r.cli[0].ClusterNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if nodes[2].State != "lost" || nodes[0].State != "ready" {
		t.Fatalf("nodes: %+v", nodes)
	}
}

// waitSummary waits until node's sandbox summary in etcd lists n
// sandboxes.
func waitSummary(t *testing.T, r *rig, node string, n int) {
	t.Helper()
	cli, err := cluster.Dial(r.etcd.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	deadline := time.Now().Add(10 * time.Second)
	got := -1
	for time.Now().Before(deadline) {
		resp, err := cli.Get(context.Background(), "/corral/sandboxes/"+node)
		if err == nil && len(resp.Kvs) == 1 {
			var s struct{ Sandboxes []json.RawMessage }
			if zr, err := gzip.NewReader(bytes.NewReader(resp.Kvs[0].Value)); err == nil && json.NewDecoder(zr).Decode(&s) == nil {
				if got = len(s.Sandboxes); got == n {
					return
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("node %s's summary lists %d sandboxes, want %d", node, got, n)
}

// listPage asks for one page (the SDK's List fetches them all).
func listPage(ctx context.Context, sock, tok string, size int) ([]*corralv1.Sandbox, string, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	c := corralv1connect.NewSandboxServiceClient(hc, "http://control")
	resp, err := c.List(ctx, connect.NewRequest(&corralv1.ListRequest{PageSize: int32(size), PageToken: tok}))
	if err != nil {
		return nil, "", err
	}
	return resp.Msg.Sandboxes, resp.Msg.NextPageToken, nil
}

// TestRetriedCreateIsNotDuplicated: a create whose control instance dies
// while the node is still making it is retried (same request id, retry
// set) on another instance, which returns the sandbox the first attempt
// made: one sandbox in all.
func TestRetriedCreateIsNotDuplicated(t *testing.T) {
	r := slowRig(t, 400*time.Millisecond)
	ctx := context.Background()
	opts := client.CreateOptions{Placement: client.Placement{RequestID: "job7-episode3"}}
	first := make(chan error, 1)
	go func() {
		_, err := r.cli[0].Create(ctx, opts)
		first <- err
	}()
	time.Sleep(100 * time.Millisecond) // the node is making it now
	r.ctl[0].Stop(ctx)
	<-first
	opts.Placement.Retry = true
	sb, err := r.cli[1].Create(ctx, opts)
	if err != nil {
		t.Fatalf("retry on the other instance: %v", err)
	}
	again, err := r.cli[1].Create(ctx, opts)
	if err != nil || again.ID() != sb.ID() {
		t.Fatalf("second retry: %v, %v; want %s", again, err, sb.ID())
	}
	total := 0
	for _, n := range r.fleet.Nodes() {
		total += n.Created()
	}
	if total != 1 {
		t.Fatalf("%d sandboxes made for one request id", total)
	}
}

// TestSpreadByLabel: creates spread by a job label land evenly on the
// nodes after other load, and a create naming a label it
// does not carry is refused by name.
func TestSpreadByLabel(t *testing.T) {
	r := startRig(t, specs(3, 1000), 1, cluster.PlacerConfig{K: 2})
	ctx := context.Background()
	for range 5 { // some load of another job first
		if _, err := r.cli[0].Create(ctx, client.CreateOptions{Labels: map[string]string{"job": "other"}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, job := range []string{"a", "b"} {
		for range 9 {
			_, err := r.cli[0].Create(ctx, client.CreateOptions{Labels: map[string]string{"job": job},
				Placement: client.Placement{SpreadByLabel: "job"}})
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range r.fleet.Nodes() {
			if got := n.LiveWith("job", job); got != 3 {
				t.Fatalf("job %s: node %s has %d of 9, want 3 on each", job, n.ID, got)
			}
		}
	}
	_, err := r.cli[0].Create(ctx, client.CreateOptions{Placement: client.Placement{SpreadByLabel: "job"}})
	if !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "spread_by_label") {
		t.Fatalf("spread by a missing label: %v", err)
	}
}

// TestLeaseLossReRegisters: a node whose lease is gone (revoked here, as
// an expiry while etcd was unreachable would) keeps its sandboxes and
// registers again under a new lease.
func TestLeaseLossReRegisters(t *testing.T) {
	r := startRig(t, specs(2, 1000), 1, cluster.PlacerConfig{K: 2})
	ctx := context.Background()
	var ids []string
	for range 6 {
		sb, err := r.cli[0].Create(ctx, client.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID())
	}
	cli, err := cluster.Dial(r.etcd.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, "/corral/cluster/nodes/sim000")
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("sim000's record: %v, %v", resp, err)
	}
	old := resp.Kvs[0].Lease
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(old)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := cli.Get(ctx, "/corral/cluster/nodes/sim000")
		if err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].Lease != old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sim000 never registered again under a new lease")
		}
		time.Sleep(50 * time.Millisecond)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.ctl[0].Watcher().WaitFor(wctx, func(s *cluster.Snapshot) bool { return s.Node("sim000").State == cluster.NodeReady }); err != nil {
		t.Fatal("control never saw sim000 ready again")
	}
	for _, id := range ids {
		in, err := r.cli[0].Get(ctx, id)
		if err != nil || in.State != client.StateRunning {
			t.Fatalf("sandbox %s after re-registration: %+v, %v", id, in, err)
		}
	}
}
