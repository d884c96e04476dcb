package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/state"
)

// fenceVM is a running sandbox that snapshots and pauses (the rest of
// backend.Sandbox is not used here); resumed receives each Resume.
type fenceVM struct {
	backend.Sandbox
	mu      sync.Mutex
	paused  bool
	resumed chan struct{}
}

func (v *fenceVM) SnapshotTo(_ context.Context, dir string) (int64, error) {
	return 4, os.WriteFile(filepath.Join(dir, "memory.snap"), []byte("mem!"), 0o600)
}

func (v *fenceVM) Pause(context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.paused = true
	return nil
}

func (v *fenceVM) Resume(context.Context) error {
	v.mu.Lock()
	v.paused = false
	v.mu.Unlock()
	v.resumed <- struct{}{}
	return nil
}

// waitResumed waits for the next Resume (a bound only against a hang).
func (v *fenceVM) waitResumed(t *testing.T) {
	t.Helper()
	select {
	case <-v.resumed:
	case <-time.After(time.Minute):
		t.Fatal("the sandbox was not resumed")
	}
}

func (v *fenceVM) isPaused() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.paused
}

func fenceNode(t *testing.T) (*Node, *fenceVM, string) {
	n := migrationNode(t, "nfen01")
	db, err := state.Open(filepath.Join(n.cfg.DataDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	n.db, n.sandboxes = db, map[string]*entry{}
	id := "nfen01-0123456789ab"
	vm := &fenceVM{resumed: make(chan struct{}, 4)}
	n.sandboxes[id] = &entry{rec: &state.Record{ID: id, Backend: "microvm", Phase: state.PhaseRunning}, sb: vm, backend: restoringBackend{}}
	return n, vm, id
}

// refusedAsMigrating checks that err is the fence's refusal.
func refusedAsMigrating(t *testing.T, what string, err error, id string) {
	t.Helper()
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "sandbox "+id+" is migrating to node ndst01; retry") {
		t.Errorf("%s while fenced: %v, want unavailable naming the migration", what, err)
	}
}

// TestSnapshotFenced: a migration's snapshot leaves the sandbox paused
// and every call but Get (which shows it), List and — once held — Delete
// refused UNAVAILABLE naming the migration; lifting the fence resumes it
// (one paused before stays paused), so does its lapse, and so does a
// restart of the node.
func TestSnapshotFenced(t *testing.T) {
	ctx := context.Background()
	n, vm, id := fenceNode(t)
	if _, err := n.SnapshotFenced(ctx, id, "", 0); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "target_node") {
		t.Errorf("fence without a target: %v", err)
	}
	if _, err := n.SnapshotFenced(ctx, id, "ndst01", 2*MaxFenceLapse); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "lapse") {
		t.Errorf("fence with a lapse over the limit: %v", err)
	}
	info, err := n.SnapshotFenced(ctx, id, "ndst01", 0)
	if err != nil {
		t.Fatal(err)
	}
	if !vm.isPaused() || n.sandboxes[id].snapshot().Phase != state.PhasePaused {
		t.Fatal("the fenced sandbox is not paused after its snapshot")
	}
	if _, err := os.Stat(filepath.Join(n.fenceRoot(), id)); err != nil {
		t.Errorf("no fence mark for a restart: %v", err)
	}
	// The transparent resume of a paused sandbox is refused as well.
	_, err = n.Exec(ctx, id, ExecRequest{Argv: []string{"true"}}, nil)
	refusedAsMigrating(t, "exec", err, id)
	_, err = n.ReadFile(ctx, id, "/etc/hostname", 0, 0)
	refusedAsMigrating(t, "read", err, id)
	refusedAsMigrating(t, "resume", n.Resume(ctx, id), id)
	refusedAsMigrating(t, "pause", n.Pause(ctx, id), id)
	_, err = n.Snapshot(ctx, id)
	refusedAsMigrating(t, "snapshot", err, id)
	_, err = n.Fork(ctx, id, 1)
	refusedAsMigrating(t, "fork", err, id)
	_, err = n.SnapshotFenced(ctx, id, "ndst01", 0)
	refusedAsMigrating(t, "a second migration", err, id)
	_, err = n.Delete(ctx, id)
	refusedAsMigrating(t, "delete before the switch", err, id)
	if sb, err := n.Get(ctx, id); err != nil || sb.MigratingTo != "ndst01" {
		t.Errorf("get while fenced: %+v, %v, want migrating_to ndst01", sb, err)
	}
	if page, _, err := n.List(ctx, ListFilter{}); err != nil || len(page) != 1 || page[0].MigratingTo != "ndst01" {
		t.Errorf("list while fenced: %v, %v", page, err)
	}
	if n.snaps.byID[info.ID] == nil {
		t.Errorf("snapshot %s not kept", info.ID)
	}

	// Lifted (the migration failed): it resumes and serves again.
	if err := n.LiftFence(ctx, id); err != nil {
		t.Fatal(err)
	}
	vm.waitResumed(t)
	if n.sandboxes[id].snapshot().Phase != state.PhaseRunning {
		t.Error("not running after the fence was lifted")
	}
	if err := n.Pause(ctx, id); err != nil {
		t.Errorf("pause after the fence: %v", err)
	}
	if err := n.Resume(ctx, id); err != nil {
		t.Errorf("resume after the fence: %v", err)
	}
	vm.waitResumed(t)
	if err := n.HoldFence(ctx, id); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("hold without a fence: %v, want failed precondition", err)
	}
	if _, err := os.Stat(filepath.Join(n.fenceRoot(), id)); !os.IsNotExist(err) {
		t.Errorf("fence mark after the lift: %v", err)
	}

	// A fence that lapses resumes the sandbox on its own (the resume of
	// the fence's pause is what the channel waits for); a hold after it
	// is refused, so the migration does not switch.
	if _, err := n.SnapshotFenced(ctx, id, "ndst01", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	vm.waitResumed(t)
	if err := n.HoldFence(ctx, id); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "must not switch") {
		t.Errorf("hold after the lapse: %v, want failed precondition", err)
	}

	// A sandbox paused before its migration is resumed for the snapshot
	// (as by any request) and stays paused when the fence is lifted.
	if err := n.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := n.SnapshotFenced(ctx, id, "ndst01", 0); err != nil {
		t.Fatal(err)
	}
	vm.waitResumed(t)
	if err := n.LiftFence(ctx, id); err != nil {
		t.Fatal(err)
	}
	if !vm.isPaused() || n.sandboxes[id].snapshot().Phase != state.PhasePaused {
		t.Error("a sandbox paused before its failed migration is not paused after it")
	}
	if err := n.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	vm.waitResumed(t)

	// Held (the switch): it stays fenced and paused.
	if _, err := n.SnapshotFenced(ctx, id, "ndst01", 0); err != nil {
		t.Fatal(err)
	}
	if err := n.HoldFence(ctx, id); err != nil {
		t.Fatalf("hold: %v", err)
	}
	if sb, err := n.Get(ctx, id); err != nil || sb.MigratingTo != "ndst01" || !vm.isPaused() {
		t.Errorf("after the hold: %+v, %v, paused %v; want still fenced and paused", sb, err, vm.isPaused())
	}

	// A restart drops the fence, held or not: the sandbox is resumed.
	restarted := &Node{id: n.id, cfg: n.cfg, db: n.db, log: n.log, backends: n.backends, execLog: n.execLog,
		sandboxes: map[string]*entry{id: {rec: n.sandboxes[id].snapshot(), sb: vm, backend: restoringBackend{}}}}
	restarted.dropFences(ctx)
	vm.waitResumed(t)
	if got := restarted.sandboxes[id].snapshot().Phase; got != state.PhaseRunning {
		t.Errorf("after a restart the fenced sandbox is %s, want running", got)
	}
	if _, err := os.Stat(filepath.Join(n.fenceRoot(), id)); !os.IsNotExist(err) {
		t.Errorf("fence mark after the restart: %v", err)
	}
}
