package bench

import (
	"context"
	"os"
	"testing"

	"github.com/corral-dev/corral/client"
)

func TestScratchExec(t *testing.T) {
	addr := os.Getenv("SCRATCH_ADDR")
	if addr == "" {
		t.Skip()
	}
	c, _ := client.New(addr)
	ctx := context.Background()
	for range 10 {
		sb, err := c.Create(ctx, client.CreateOptions{Image: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Run(ctx, trueCmd); err != nil {
			t.Fatal(err)
		}
		sb.Delete(ctx)
	}
	sb, err := c.Create(ctx, client.CreateOptions{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(ctx)
	seq := os.Getenv("SCRATCH_SEQ")
	for i, ch := range seq {
		var r *client.Result
		if ch == 'r' {
			r, err = sb.Run(ctx, trueCmd)
		} else {
			r, err = sb.Exec(ctx, trueCmd)
		}
		t.Logf("%d %c: %+v %v", i, ch, r, err)
	}
}
