package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// bootVM creates a full VM from image ref (one CPU, 512 MiB) and logs
// its boot time; the caller deletes it.
func bootVM(ctx context.Context, t *testing.T, c *client.Client, ref string) *client.Sandbox {
	t.Helper()
	boot := time.Now()
	sb, err := c.Create(ctx, client.CreateOptions{Backend: "vm", Image: ref,
		Resources: client.Resources{CPUMillis: 1000, MemoryBytes: 512 << 20}})
	if err != nil {
		t.Fatalf("create vm: %v", err)
	}
	t.Logf("vm booted in %v", time.Since(boot).Round(time.Millisecond))
	return sb
}

// TestVMSnapshotRestoreFork drives the node's snapshot, restore and fork
// of a running full VM through the API (one boot; restores boot nothing):
// the restored sandbox and both forks count on from the snapshotted value
// under their own ids, with their own disks, and the parent runs on.
func TestVMSnapshotRestoreFork(t *testing.T) {
	testenv.RequireVMImage(t)
	const ref = "debian@snap"
	srv := testenv.StartServer(t, func(cfg *server.Config) { testenv.AdoptVMImage(t, cfg.DataDir, ref) })
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	sb := bootVM(ctx, t, c, ref)
	defer func() { _ = sb.Delete(context.Background()) }()
	testenv.Sh(t, sb, "setsid sh -c 'echo $$ > /tmp/counter.pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/count; sleep 0.2; done' </dev/null >/dev/null 2>&1 & echo parent > /root/who; until [ -s /tmp/count ]; do sleep 0.1; done")
	before := testenv.ReadCounter(t, sb)

	start := time.Now()
	snap, err := sb.Snapshot(ctx)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	t.Logf("snapshot %s: %d MiB in %v", snap.ID, snap.Bytes>>20, time.Since(start).Round(time.Millisecond))
	if snap.Backend != "vm" || snap.Bytes <= 0 {
		t.Errorf("snapshot: %+v", snap)
	}
	after := testenv.AssertCounting(t, "the original after its snapshot", sb, before)

	start = time.Now()
	restored, _, err := c.Restore(ctx, snap.ID, nil)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	t.Logf("restore: %v", time.Since(start).Round(time.Millisecond))
	defer func() { _ = restored.Delete(context.Background()) }()
	if restored.ID() == sb.ID() {
		t.Errorf("restored sandbox has the source's id %s", sb.ID())
	}
	testenv.AssertCounting(t, "the restored vm", restored, before)
	if got := testenv.Sh(t, restored, "cat /root/who"); got != "parent\n" {
		t.Errorf("restored vm's file: %q", got)
	}
	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Errorf("delete snapshot: %v", err)
	}
	// The restored VM needs nothing of its snapshot once made.
	testenv.AssertCounting(t, "the restored vm without its snapshot", restored, before)

	start = time.Now()
	res, err := sb.Fork(ctx, 2)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	t.Logf("fork × 2: %v", time.Since(start).Round(time.Millisecond))
	for i, f := range res.Forks {
		if f.Err != nil {
			t.Fatalf("fork %d: %v", i, f.Err)
		}
		defer func() { _ = f.Sandbox.Delete(context.Background()) }()
		testenv.Sh(t, f.Sandbox, "echo fork-"+strconv.Itoa(i)+" > /root/who")
	}
	for i, f := range res.Forks {
		testenv.AssertCounting(t, "fork "+strconv.Itoa(i), f.Sandbox, after)
		if got := testenv.Sh(t, f.Sandbox, "cat /root/who"); got != "fork-"+strconv.Itoa(i)+"\n" {
			t.Errorf("fork %d sees %q: disks are not its own", i, got)
		}
	}
	if got := testenv.Sh(t, sb, "cat /root/who"); !strings.Contains(got, "parent") {
		t.Errorf("parent sees %q after its forks wrote theirs", got)
	}
	if list, _ := c.ListSnapshots(ctx); len(list) != 0 {
		t.Errorf("snapshots after the fork: %+v, want none (the fork's own is removed)", list)
	}
}
