package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestIOLimitsPerSandbox: a create may lower the node's disk I/O limits
// for its sandbox, never raise them. A request above the node's limit is
// refused naming the field and the limit, with nothing made; a sandbox
// given 4 MiB/s of writes takes at least 2 s to write 12 MiB with O_DIRECT
// (throttling only ever makes it slower, whatever the machine's load);
// its record shows the limits asked for.
func TestIOLimitsPerSandbox(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	_, err := srv.Client.Create(ctx, client.CreateOptions{Resources: client.Resources{IO: client.IOLimits{WriteBytesPerSec: 1 << 40}}})
	if !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "resources.io.write_bps") || !strings.Contains(err.Error(), "128Mi") {
		t.Fatalf("create above the node's write limit: %v, want invalid_argument naming resources.io.write_bps and 128Mi", err)
	}
	_, err = srv.Client.Create(ctx, client.CreateOptions{Resources: client.Resources{IO: client.IOLimits{ReadOpsPerSec: -1}}})
	if !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "resources.io.read_iops") {
		t.Fatalf("negative read iops: %v, want invalid_argument naming resources.io.read_iops", err)
	}
	if list, err := srv.Client.List(ctx, client.ListOptions{}); err != nil || len(list) != 0 {
		t.Fatalf("refused creates left %d sandboxes (%v)", len(list), err)
	}

	const limit = 4 << 20
	slow := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Resources: client.Resources{IO: client.IOLimits{WriteBytesPerSec: limit}}})
	info, err := slow.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Resources.IO != (client.IOLimits{WriteBytesPerSec: limit}) {
		t.Errorf("info: io %+v, want write %d B/s", info.Resources.IO, limit)
	}
	fast := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	write := func(sb *client.Sandbox) time.Duration {
		start := time.Now()
		testenv.Sh(t, sb, "dd if=/dev/zero of=/data bs=1M count=12 oflag=direct conv=fsync 2>/dev/null && rm /data")
		return time.Since(start)
	}
	took, peer := write(slow), write(fast)
	t.Logf("12 MiB O_DIRECT: %v at 4 MiB/s; %v at the node's limit (128 MiB/s)", took.Round(time.Millisecond), peer.Round(time.Millisecond))
	if took < 2*time.Second {
		t.Errorf("12 MiB written in %v under a 4 MiB/s limit: the limit is not in force", took)
	}
}
