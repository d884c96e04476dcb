package bench

import (
	"context"
	"testing"
	"time"
)

// Each placement mode starts from emptied nodes: a mode that found the
// nodes full of the previous modes' sandboxes would fail every create.
func TestClusterModesStartFromEmptyNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Cluster(ctx, ClusterOptions{SimulatedNodes: 4, Sandboxes: 40, Concurrency: 8,
		NodeLatency: time.Millisecond, BasePort: 17960})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 3 {
		t.Fatalf("%d placement runs, want 3", len(res.Runs))
	}
	for _, r := range res.Runs {
		if r.Failed != 0 || r.Creates != 40 {
			t.Errorf("%s: %d creates, %d failed; want 40 and 0", r.Mode, r.Creates, r.Failed)
		}
	}
}
