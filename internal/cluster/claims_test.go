package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
)

// TestSameRequestAtTwoInstances: a create with a client request id sent at
// once to both control instances (and twice to one), with no retry flag,
// makes one sandbox, and every answer names it.
func TestSameRequestAtTwoInstances(t *testing.T) {
	r := slowRig(t, 200*time.Millisecond)
	ctx := context.Background()
	const n = 24
	got := make([][3]string, n)
	var wg sync.WaitGroup
	for i := range n {
		for j, c := range []*client.Client{r.cli[0], r.cli[1], r.cli[i%2]} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb, err := c.Create(ctx, client.CreateOptions{Placement: client.Placement{RequestID: fmt.Sprintf("dup-%d", i)}})
				if err != nil {
					t.Errorf("request %d, call %d: %v", i, j, err)
					return
				}
				got[i][j] = sb.ID()
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for i, ids := range got {
		if ids[0] != ids[1] || ids[1] != ids[2] {
			t.Fatalf("request %d: answers name %v, want one sandbox", i, ids)
		}
	}
	total := 0
	for _, nd := range r.fleet.Nodes() {
		total += nd.Created()
	}
	if total != n {
		t.Fatalf("%d sandboxes made for %d request ids", total, n)
	}
}
