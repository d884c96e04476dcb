package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/procfs"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestMigrateMicroVM moves a running microVM between the two nodes of a
// cluster (real etcd, microVM under TCG, one boot): through the control
// instance the same id then reaches the new node, whose copy has the
// file written before and a counter going on from at least its value
// before the move; the old node keeps nothing of it, and a delete
// leaves nothing on either; a keyed command replays from the exec log
// that came along. While it migrates, the original is fenced: an exec
// on its node or through the control instance is refused UNAVAILABLE
// naming the migration. Bad inputs are refused naming the field; a
// migration failing half way (the target lacks the image) lifts the
// fence, leaving the original running (counting again), and nothing on
// the target; a snapshot and restore on
// one node is timed beside the migration.
func TestMigrateMicroVM(t *testing.T) {
	if _, err := os.Stat("/usr/bin/qemu-system-x86_64"); err != nil {
		t.Skip("microvm: needs qemu-system-x86_64 (package qemu-system-x86)")
	}
	if ks, _ := filepath.Glob("/boot/vmlinuz-*"); len(ks) == 0 {
		t.Skip("microvm: needs a guest kernel (package linux-image-amd64)")
	}
	r := startRig(t, false, 1, 2, "--microvm-snapshot-after", "1h")
	c := r.cli[0]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	n0, n1 := nodeID(t, r, 0), nodeID(t, r, 1)
	on0 := client.Placement{NodeLabels: map[string]string{"rack": "r0"}}

	if _, err := c.Sandbox(n0+"-000000000000").Migrate(ctx, n1); !client.IsNotFound(err) {
		t.Errorf("migrate of an unknown sandbox: %v, want not found", err)
	}
	// A project's token may not pick nodes: migration is the cluster
	// administrator's.
	member, err := client.New(fmt.Sprintf("127.0.0.1:%d", controlBase), client.WithToken(projectToken(t, c, "mig", client.Quota{})))
	if err != nil {
		t.Fatal(err)
	}
	defer member.Close()
	if _, err := member.Sandbox(n0+"-000000000000").Migrate(ctx, n1); !client.IsPermissionDenied(err) {
		t.Errorf("migrate with a project's token: %v, want permission denied", err)
	}
	ctr, err := c.Create(ctx, client.CreateOptions{Placement: on0})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctr.Migrate(ctx, n1); !client.IsUnimplemented(err) || !strings.Contains(err.Error(), "CRIU") {
		t.Errorf("migrate of a container: %v, want unimplemented naming CRIU", err)
	}
	if err := ctr.Delete(ctx); err != nil {
		t.Fatal(err)
	}

	// The VM's image is a composition over busybox's layers that node 1
	// lacks at first: a migration there fails at the restore, half way.
	comp := client.Composition{Ref: "migrate@1"}
	imgs, err := nodeClient(t, r, 0).ListImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range imgs.Built {
		if b.Name == "busybox" {
			comp.Env = b.Env
			for _, l := range b.Layers {
				comp.Layers = append(comp.Layers, l.Ref)
			}
		}
	}
	if _, err := nodeClient(t, r, 0).CreateComposition(ctx, comp); err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, client.CreateOptions{Backend: "microvm", Image: comp.Ref, Resources: client.Resources{MemoryBytes: 256 << 20},
		Labels: map[string]string{"job": "migrate"}, Placement: on0})
	if err != nil {
		t.Fatal(err)
	}
	if info, err := sb.Info(ctx); err != nil || info.NodeID != n0 {
		t.Fatalf("microVM on node %s: %+v, %v", n0, info, err)
	}
	for _, bad := range []struct {
		node  string
		check func(error) bool
	}{{"", client.IsInvalidArgument}, {"nosuchnode", client.IsInvalidArgument}, {n0, client.IsFailedPrecondition}} {
		if _, err := sb.Migrate(ctx, bad.node); !bad.check(err) || !strings.Contains(err.Error(), "target_node") {
			t.Errorf("migrate to %q: %v, want an error naming target_node", bad.node, err)
		}
	}
	testenv.Sh(t, sb, "echo written-before > /root/kept; sync")
	keyed := client.Command{Shell: "echo once >> /root/once", IdempotencyKey: "migrate-1"}
	if res, err := sb.Run(ctx, keyed); err != nil || res.ExitCode != 0 || res.Replayed {
		t.Fatalf("keyed command: %+v, %v", res, err)
	}
	testenv.StartCounter(t, sb)

	// The peer, in the same run: a snapshot and a restore on one node.
	start := time.Now()
	snap, err := sb.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snapTook := time.Since(start)
	start = time.Now()
	copyOf, _, err := c.Restore(ctx, snap.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	restoreTook := time.Since(start)
	if err := copyOf.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}

	if len(vmmOf(r, 0, sb.ID())) == 0 {
		t.Fatalf("no VMM of sandbox %s found on node 0 (the leftover checks would see nothing)", sb.ID())
	}

	// A migration that fails after the copy (node 1 has no such image)
	// leaves the original running and nothing on node 1.
	before := testenv.ReadCounter(t, sb)
	_, err = sb.Migrate(ctx, n1)
	if err == nil || !strings.Contains(err.Error(), comp.Ref) {
		t.Errorf("migrate to a node without the image: %v, want an error naming %s", err, comp.Ref)
	}
	t.Logf("migration to a node without the image: %v", err)
	assertNothingOf(t, r, 1, sb.ID())
	if info, err := sb.Info(ctx); err != nil || info.NodeID != n0 {
		t.Errorf("after a failed migration: %+v, %v", info, err)
	}
	// The fence was lifted: the original is no longer paused, counts on
	// and serves calls.
	if info, err := nodeClient(t, r, 0).Sandbox(sb.ID()).Info(ctx); err != nil || info.MigratingTo != "" || info.State != client.StateRunning {
		t.Errorf("on node 0 after a failed migration: %+v, %v, want running and not migrating", info, err)
	}
	testenv.AssertCounting(t, "after a failed migration (the original must be resumed)", sb, before)
	if snaps, err := c.ListSnapshots(ctx); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots left by a failed migration: %+v, %v", snaps, err)
	}
	if _, err := nodeClient(t, r, 1).CreateComposition(ctx, comp); err != nil {
		t.Fatal(err)
	}

	before = testenv.ReadCounter(t, sb)
	type migrated struct {
		m   *client.Migration
		err error
	}
	done := make(chan migrated, 1)
	go func() {
		m, err := sb.Migrate(ctx, n1)
		done <- migrated{m, err}
	}()
	// While it migrates the original is fenced: node 0 shows it so, and
	// an exec sent to node 0 itself is refused UNAVAILABLE naming the
	// migration. The fence lasts from before the snapshot until the
	// original's delete after the switch, and never lifts in a migration
	// that succeeds, so seen before and after the exec it held at the
	// exec.
	on0sb := nodeClient(t, r, 0).Sandbox(sb.ID())
	fenced := func() bool {
		info, err := on0sb.Info(ctx)
		return err == nil && info.MigratingTo == n1
	}
	for !fenced() {
		select {
		case res := <-done:
			t.Fatalf("the migration ended (%v) before node 0 showed the sandbox fenced", res.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	_, execErr := on0sb.Run(ctx, client.Command{Shell: "echo after-the-fence > /root/kept"})
	// Through the control instance, which still routes the id to node 0.
	_, viaControl := sb.Run(ctx, client.Command{Shell: "echo after-the-fence > /root/kept"})
	if !fenced() {
		t.Fatal("the fence ended before the check of the execs (the migration outran the test); nothing was learnt")
	}
	for what, err := range map[string]error{"on node 0's socket": execErr, "through the control instance": viaControl} {
		if !client.IsUnavailable(err) || !strings.Contains(err.Error(), "is migrating to node "+n1+"; retry") {
			t.Errorf("exec %s during the migration: %v, want unavailable naming the migration", what, err)
		}
	}
	res := <-done
	m, err := res.m, res.err
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("migration of a 256 MiB microVM: %v (snapshot %v, copy %v of %d MiB, restore %v); on one node snapshot %v + restore %v = %v",
		m.Total, m.SnapshotTime, m.CopyTime, m.BytesCopied>>20, m.RestoreTime, snapTook, restoreTook, snapTook+restoreTook)
	if m.SourceNode != n0 || m.Sandbox.ID != sb.ID() || m.Sandbox.NodeID != n1 || m.Warning != "" {
		t.Errorf("migration: %+v", m)
	}

	// The same id, through the control instance, now reaches node 1.
	info, err := sb.Info(ctx)
	if err != nil || info.NodeID != n1 || info.ID != sb.ID() || info.Labels["job"] != "migrate" {
		t.Fatalf("after the migration: %+v, %v", info, err)
	}
	if got := strings.TrimSpace(testenv.Sh(t, sb, "cat /root/kept")); got != "written-before" {
		t.Errorf("file after the migration: %q", got)
	}
	// The exec log came along: the keyed command replays, not runs again.
	if res, err := sb.Run(ctx, keyed); err != nil || !res.Replayed {
		t.Errorf("keyed command repeated after the migration: %+v, %v, want replayed", res, err)
	}
	if got := testenv.Sh(t, sb, "cat /root/once"); got != "once\n" {
		t.Errorf("the keyed command's file after the migration: %q, want one line", got)
	}
	testenv.AssertCounting(t, "after the migration", sb, before)
	list, err := c.List(ctx, client.ListOptions{Labels: map[string]string{"job": "migrate"}})
	if err != nil || len(list) != 1 || list[0].ID != sb.ID() || list[0].NodeID != n1 {
		t.Errorf("list after the migration: %+v, %v", list, err)
	}
	if len(vmmOf(r, 1, sb.ID())) == 0 {
		t.Errorf("no VMM of sandbox %s on node 1 after the migration", sb.ID())
	}
	assertNothingOf(t, r, 0, sb.ID())
	if snaps, err := c.ListSnapshots(ctx); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots left by the migration: %+v, %v", snaps, err)
	}

	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Info(ctx); !client.IsNotFound(err) {
		t.Errorf("get after the delete: %v, want not found", err)
	}
	for i := range 2 {
		assertNothingOf(t, r, i, sb.ID())
	}
}

// nodeClient is a client of node i's own socket, as its administrator.
func nodeClient(t *testing.T, r *rig, i int) *client.Client {
	t.Helper()
	c, err := client.New("unix://" + filepath.Join(r.nodeDir[i], "corral.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// vmmOf lists the processes of node i's sandbox id: those whose command
// line names the node's data dir and the id (its VMM).
func vmmOf(r *rig, i int, id string) []string {
	var out []string
	for pid, args := range procfs.Cmdlines() {
		if s := strings.Join(args, " "); strings.Contains(s, r.nodeDir[i]) && strings.Contains(s, id) {
			out = append(out, fmt.Sprintf("process %d: %s", pid, s))
		}
	}
	return out
}

// assertNothingOf checks that node i holds nothing of sandbox id: no VMM
// (vmmOf), no file or mount named by the id under its data dir (run dir,
// disk overlay).
func assertNothingOf(t *testing.T, r *rig, i int, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a delete's teardown finishes in the background
	for {
		left := vmmOf(r, i, id)
		_ = filepath.WalkDir(r.nodeDir[i], func(p string, d os.DirEntry, err error) error {
			if err == nil && strings.Contains(d.Name(), id) {
				left = append(left, "file "+p)
			}
			return nil
		})
		for _, mp := range testenv.MountsUnder(r.nodeDir[i]) {
			if strings.Contains(mp, id) {
				left = append(left, "mount "+mp)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %d still holds sandbox %s: %s", i, id, strings.Join(left, "; "))
		}
		time.Sleep(300 * time.Millisecond)
	}
}
