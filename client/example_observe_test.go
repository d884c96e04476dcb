package client_test

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/client"
)

// Read a sandbox's figures, then replay its lifecycle events from the
// node's event log (pass the last Seq seen as After to resume later).
func ExampleClient_Events() {
	ctx := context.Background()
	c, err := client.New(addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	sb, err := c.Create(ctx, client.CreateOptions{Resources: client.Resources{MemoryBytes: 64 << 20}})
	if err != nil {
		fmt.Println(err)
		return
	}
	stats, err := c.Stats(ctx, client.StatsOptions{IDs: []string{sb.ID()}})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(stats[0].State, stats[0].MemoryLimitBytes>>20, "MiB limit", stats[0].Current.Pids > 0)
	_ = sb.Pause(ctx)
	_ = sb.Resume(ctx)
	_ = sb.Delete(ctx)

	zero := uint64(0)
	for e, err := range c.Events(ctx, client.EventOptions{After: &zero, SandboxIDs: []string{sb.ID()}}) {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(e.Type)
		if e.Type == client.EventDeleted {
			break
		}
	}
	// Output:
	// running 64 MiB limit true
	// created
	// started
	// paused
	// resumed
	// deleted
}
