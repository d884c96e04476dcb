package client_test

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/client"
)

// Note where the node's event log is, make a sandbox, read its figures,
// then replay its lifecycle events from that point (pass the last Seq seen
// as After to resume later, also after a daemon restart).
func ExampleClient_Events() {
	ctx := context.Background()
	c, err := client.New(addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	nodes, err := c.Nodes(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	from := nodes[0].LastEventSeq
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

	for e, err := range c.Events(ctx, client.EventOptions{After: &from, SandboxIDs: []string{sb.ID()}}) {
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
