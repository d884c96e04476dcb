package cluster_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/testenv"
)

// tokenClient makes a token of project on admin and a client using it over
// control i's TCP listener.
func (r *rig) tokenClient(t *testing.T, i int, project string) *client.Client {
	t.Helper()
	_, secret, err := r.cli[0].CreateToken(context.Background(), client.TokenOptions{Project: project})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(fmt.Sprintf("127.0.0.1:%d", portBase+3+i), client.WithToken(secret))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestClusterQuota: a project's max_sandboxes holds over the whole cluster,
// not per node: of a burst of creates through one control instance exactly
// the quota succeed, spread over the nodes; the rest, and a create through
// the other instance, are refused naming the project, quota, limit and use;
// a delete frees its share at once.
func TestClusterQuota(t *testing.T) {
	r := startRig(t, specs(3, 1000), 2, cluster.PlacerConfig{K: 2})
	ctx := context.Background()
	const quota = 6
	if _, err := r.cli[0].CreateProject(ctx, "q", client.Quota{MaxSandboxes: quota}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.cli[0].CreateProject(ctx, "q/sub", client.Quota{}); err != nil {
		t.Fatal(err)
	}
	c0, c1 := r.tokenClient(t, 0, "q"), r.tokenClient(t, 1, "q")
	sub := r.tokenClient(t, 0, "q/sub")

	made, refused := testenv.CreateRace(t, quota+4, func(i int) (*client.Sandbox, error) {
		if i%3 == 0 {
			return sub.Create(ctx, client.CreateOptions{}) // a subproject's sandboxes count against q too
		}
		return c0.Create(ctx, client.CreateOptions{})
	})
	if len(made) != quota || len(refused) != 4 {
		t.Fatalf("%d made, %d refused of %d creates with max_sandboxes %d: %v", len(made), len(refused), quota+4, quota, refused)
	}
	perNode := map[string]int{}
	for _, sb := range made {
		perNode[nodeOf(sb.ID())]++
	}
	if len(perNode) < 2 {
		t.Fatalf("the project's %d sandboxes are all on one node: %v", quota, perNode)
	}
	want := fmt.Sprintf("project q: quota max_sandboxes: limit %d, in use %d", quota, quota)
	for _, err := range refused {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("refusal %q does not say %q", err, want)
		}
	}

	// The other control instance counts the same sandboxes, from the
	// nodes' reports.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := r.ctl[1].Watcher().WaitFor(wctx, func(s *cluster.Snapshot) bool {
		n := int64(0)
		for _, v := range s.Nodes {
			n += v.Load.Projects["q"].Sandboxes + v.Load.Projects["q/sub"].Sandboxes
		}
		return n == quota
	})
	if err != nil {
		t.Fatal("control 1 never saw the project's sandboxes in the nodes' reports")
	}
	if _, err := c1.Create(ctx, client.CreateOptions{}); !client.IsResourceExhausted(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("create through control 1 at the quota: %v, want %q", err, want)
	}
	// A delete through control 1 frees its share there at once.
	if err := c1.Delete(ctx, made[0].ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Create(ctx, client.CreateOptions{}); err != nil {
		t.Fatalf("create right after a delete at the quota: %v", err)
	}
	if _, err := c1.Create(ctx, client.CreateOptions{}); !client.IsResourceExhausted(err) {
		t.Fatalf("create past the quota after the replacement: %v", err)
	}
	total := 0
	for _, n := range r.fleet.Nodes() {
		total += n.Live()
	}
	if total != quota {
		t.Fatalf("%d sandboxes live on the nodes, want %d", total, quota)
	}
}
