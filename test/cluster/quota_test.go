package cluster_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/corral-dev/corral/client"
)

// clusterQuota: a project's max_sandboxes holds over the three real nodes:
// of a burst of creates with the project's token (over TCP) exactly the
// quota succeed, on more than one node; the rest are refused naming the
// project, quota, limit and use.
func clusterQuota(t *testing.T, r *rig) {
	ctx := context.Background()
	const quota = 4
	if _, err := r.cli[0].CreateProject(ctx, "cq", client.Quota{MaxSandboxes: quota}); err != nil {
		t.Fatal(err)
	}
	_, secret, err := r.cli[0].CreateToken(ctx, client.TokenOptions{Project: "cq"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(fmt.Sprintf("127.0.0.1:%d", controlBase+1), client.WithToken(secret))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mu sync.Mutex
	var made []string
	var refused []error
	var wg sync.WaitGroup
	for range quota + 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.Create(ctx, client.CreateOptions{Resources: small})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				made = append(made, sb.ID())
			case client.IsResourceExhausted(err):
				refused = append(refused, err)
			default:
				t.Errorf("create in project cq: %v", err)
			}
		}()
	}
	wg.Wait()
	nodes := map[string]bool{}
	for _, id := range made {
		nodes[nodeOf(id)] = true
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
	for _, id := range made {
		if err := c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}
