package cluster_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

// clusterQuota: a project's max_sandboxes holds over the three real nodes:
// of a burst of creates with the project's token (over TCP) exactly the
// quota succeed, on more than one node (spread by a label, else the test
// could prove a per-node count); the rest are refused naming the project,
// quota, limit and use.
func clusterQuota(t *testing.T, r *rig) {
	ctx := context.Background()
	const quota = 4
	secret := projectToken(t, r.cli[0], "cq", client.Quota{MaxSandboxes: quota})
	c, err := client.New(fmt.Sprintf("127.0.0.1:%d", controlBase+1), client.WithToken(secret))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Spread by a label, so that the sandboxes land on several nodes
	// (least-loaded placement may put four small ones on one node).
	made, refused := testenv.CreateRace(t, quota+3, func(int) (*client.Sandbox, error) {
		return c.Create(ctx, client.CreateOptions{Resources: small, Labels: map[string]string{"quota": "cq"},
			Placement: client.Placement{SpreadByLabel: "quota"}})
	})
	nodes := map[string]bool{}
	for _, sb := range made {
		nodes[nodeOf(sb.ID())] = true
	}
	if len(made) != quota || len(refused) != 3 || len(nodes) < 2 {
		t.Fatalf("project cq (max_sandboxes %d): %d made on %d nodes, %d refused: %v", quota, len(made), len(nodes), len(refused), refused)
	}
	want := fmt.Sprintf("project cq: quota max_sandboxes: limit %d, in use %d", quota, quota)
	for _, err := range refused {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("refusal %q does not say %q", err, want)
		}
	}
	for _, sb := range made {
		if err := sb.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
