package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/procfs"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestMicroVMSnapshotRestoreFork: a running microVM is snapshotted and goes
// on counting; the snapshot survives a daemon kill -9 (a half-written one
// does not); a restore continues the counter under a new identity; fork × 4
// gives four independent counters; bad inputs fail clearly and leave
// nothing behind. One booted microVM serves every step.
func TestMicroVMSnapshotRestoreFork(t *testing.T) {
	requireMicroVM(t)
	d := newDaemon(t)
	ctx := context.Background()
	c := d.start("--microvm-snapshot-after", "1h")
	snapRoot := filepath.Join(d.dataDir, "snapshots")

	// Refusals that need no microVM.
	if _, _, err := c.Restore(ctx, "snap-0000000000000000", nil); !client.IsNotFound(err) {
		t.Errorf("restore of an unknown snapshot: %v, want not found", err)
	}
	if _, _, err := c.Restore(ctx, "../x", nil); !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "snapshot_id") {
		t.Errorf("restore of a malformed id: %v, want invalid argument naming snapshot_id", err)
	}
	if err := c.DeleteSnapshot(ctx, "snap-0000000000000000"); !client.IsNotFound(err) {
		t.Errorf("delete of an unknown snapshot: %v", err)
	}
	nodeID := strings.SplitN(testenv.NewSandbox(t, c, client.CreateOptions{}).ID(), "-", 2)[0]
	if _, err := c.Sandbox(nodeID + "-000000000000").Snapshot(ctx); !client.IsNotFound(err) {
		t.Errorf("snapshot of an unknown sandbox: %v", err)
	}
	ctr, err := c.List(ctx, client.ListOptions{})
	if err != nil || len(ctr) != 1 {
		t.Fatal(err, len(ctr))
	}
	_, err = c.Sandbox(ctr[0].ID).Snapshot(ctx)
	if !client.IsUnimplemented(err) || !strings.Contains(err.Error(), "criu") {
		t.Errorf("snapshot of a container: %v, want unimplemented naming criu", err)
	}
	t.Logf("container refusal: %v", err)
	if err := c.Sandbox(ctr[0].ID).Delete(ctx); err != nil {
		t.Fatal(err)
	}

	sb, err := c.Create(ctx, client.CreateOptions{Backend: "microvm", Resources: client.Resources{MemoryBytes: 256 << 20}, Labels: map[string]string{"job": "snap"}})
	if err != nil {
		t.Fatal(err)
	}
	testenv.StartCounter(t, sb)
	testenv.Sh(t, sb, "echo parent > /tmp/who")
	before := testenv.ReadCounter(t, sb)
	start := time.Now()
	snap, err := sb.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot %s: %d bytes in %v", snap.ID, snap.Bytes, time.Since(start))
	if snap.Bytes <= 0 || snap.SandboxID != sb.ID() || snap.Backend != "microvm" {
		t.Errorf("snapshot: %+v", snap)
	}
	after := testenv.AssertCounting(t, "the original after its snapshot", sb, before)
	if _, err := sb.Fork(ctx, 0); !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "count") {
		t.Errorf("fork × 0: %v, want invalid argument naming count", err)
	}

	// A snapshot that was half written when the daemon died is removed at
	// the next start; a complete one is listed and restorable.
	half := filepath.Join(snapRoot, "snap-00000000000000ff")
	if err := os.MkdirAll(half, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(half, "memory.snap"), []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.stop(syscall.SIGKILL)
	c = d.start("--microvm-snapshot-after", "1h", "--cleanup-on-exit")
	if _, err := os.Stat(half); !os.IsNotExist(err) {
		t.Errorf("half-written snapshot still there after the restart: %v", err)
	}
	list, err := c.ListSnapshots(ctx)
	if err != nil || len(list) != 1 || list[0].ID != snap.ID || list[0].Bytes != snap.Bytes {
		t.Fatalf("snapshots after the restart: %v %+v", err, list)
	}
	sb = c.Sandbox(sb.ID())
	testenv.AssertCounting(t, "the original after the restart", sb, after)

	start = time.Now()
	restored, info, err := c.Restore(ctx, snap.ID, map[string]string{"role": "restored"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore: %v", time.Since(start))
	if restored.ID() == sb.ID() || info.Labels["job"] != "snap" || info.Labels["role"] != "restored" || info.Labels["corral.restored-from"] != snap.ID {
		t.Errorf("restored sandbox %s: labels %v", restored.ID(), info.Labels)
	}
	testenv.AssertCounting(t, "the restored sandbox", restored, before)
	if got := testenv.Sh(t, restored, "cat /tmp/who; hostname"); got != "parent\nsandbox\n" {
		t.Errorf("restored files and hostname: %q", got)
	}

	start = time.Now()
	res, err := sb.Fork(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork × 4: %v", time.Since(start))
	if !res.ProcessesCarried || len(res.Forks) != 4 || res.Snapshot == "" {
		t.Fatalf("fork result: %+v", res)
	}
	ids := map[string]bool{sb.ID(): true, restored.ID(): true}
	forkAt := testenv.ReadCounter(t, sb)
	for i, f := range res.Forks {
		if f.Err != nil {
			t.Fatalf("fork %d: %v", i, f.Err)
		}
		if ids[f.Sandbox.ID()] {
			t.Errorf("fork %d reuses sandbox id %s", i, f.Sandbox.ID())
		}
		ids[f.Sandbox.ID()] = true
		if f.Info.Labels["corral.fork-of"] != sb.ID() || f.Info.Labels["job"] != "snap" || f.Info.Labels["corral.restored-from"] != "" {
			t.Errorf("fork %d labels: %v", i, f.Info.Labels)
		}
		testenv.Sh(t, f.Sandbox, "echo fork-"+strconv.Itoa(i)+" > /tmp/who")
	}
	for i, f := range res.Forks {
		// Each fork counts on from at least where the parent was before
		// the fork's snapshot (after: the value read before the restart).
		testenv.AssertCounting(t, "fork "+strconv.Itoa(i), f.Sandbox, after)
		if got := testenv.Sh(t, f.Sandbox, "cat /tmp/who"); got != "fork-"+strconv.Itoa(i)+"\n" {
			t.Errorf("fork %d sees %q: disks are not its own", i, got)
		}
	}
	// Stopping one fork's counter leaves the others' and the parent's going.
	testenv.Sh(t, res.Forks[0].Sandbox, "kill $(cat /tmp/counter.pid)")
	stopped := testenv.ReadCounter(t, res.Forks[0].Sandbox)
	testenv.AssertCounting(t, "fork 1 beside a stopped fork 0", res.Forks[1].Sandbox, after)
	if now := testenv.ReadCounter(t, res.Forks[0].Sandbox); now > stopped+1 {
		t.Errorf("fork 0's counter went on (%d → %d) after its loop was killed", stopped, now)
	}
	testenv.AssertCounting(t, "the parent after its forks", sb, forkAt)
	if got := testenv.Sh(t, sb, "cat /tmp/who"); got != "parent\n" {
		t.Errorf("parent sees %q after its forks wrote theirs", got)
	}
	if list, _ := c.ListSnapshots(ctx); len(list) != 1 {
		t.Errorf("snapshots after the fork: %+v, want only the first (the fork's own is removed)", list)
	}

	for id := range ids {
		if err := c.Sandbox(id).Delete(ctx); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Restore(ctx, snap.ID, nil); !client.IsNotFound(err) {
		t.Errorf("restore of a deleted snapshot: %v", err)
	}
	d.stop(syscall.SIGTERM)
	if ents, _ := os.ReadDir(snapRoot); len(ents) != 0 {
		t.Errorf("left in %s: %v", snapRoot, ents)
	}
	if ents, _ := os.ReadDir(filepath.Join(d.dataDir, "vm")); len(ents) > 1 { // .initramfs stays
		t.Errorf("microVM run dirs left: %v", ents)
	}
	if pids := vmmsUnder(d.dataDir); len(pids) > 0 {
		t.Errorf("VMM processes left: %v", pids)
	}
	testenv.AssertNoLeaks(t, d.dataDir, d.parent)
	testenv.RemoveCgroupParent(d.parent)
}

// vmmsUnder lists processes whose command line names a path under dir.
func vmmsUnder(dir string) []string {
	var out []string
	for pid, args := range procfs.Cmdlines() {
		if line := strings.Join(args, " "); strings.Contains(line, dir+"/") && strings.Contains(line, "qemu") {
			out = append(out, strconv.Itoa(pid))
		}
	}
	return out
}
