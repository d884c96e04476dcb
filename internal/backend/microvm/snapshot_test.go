package microvm

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// TestSnapshotRestoreIdentity shares one guest: a call to it while paused
// fails at once (and leaves its session usable); a snapshot while it runs
// restores into a sandbox whose agent took a new secret and refuses the
// snapshot's; a restore with other resources is refused before anything
// is made.
func TestSnapshotRestoreIdentity(t *testing.T) {
	b := newBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	sb := create(t, b, testSpec(t))
	sh(t, sb, "echo before > /tmp/mark")

	t.Run("CallWhilePausedFailsFast", func(t *testing.T) {
		if err := sb.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := sb.Stat(cctx, "/tmp/mark")
		ccancel()
		if !errdefs.IsFailedPrecondition(err) {
			t.Errorf("stat of a paused guest: %v, want failed precondition at once", err)
		}
		if _, err := sb.(*sandbox).SnapshotTo(ctx, t.TempDir()); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("snapshot of a paused guest: %v, want failed precondition", err)
		}
		if err := sb.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if got := sh(t, sb, "cat /tmp/mark"); got != "before\n" {
			t.Errorf("after resume: %q", got)
		}
	})

	dir := t.TempDir()
	if _, err := sb.(*sandbox).SnapshotTo(ctx, dir); err != nil {
		t.Fatal(err)
	}
	sh(t, sb, "echo after > /tmp/mark")

	t.Run("RestoreRefusesOtherResources", func(t *testing.T) {
		spec := testSpec(t)
		spec.Resources.MemoryBytes = 512 << 20
		if _, err := b.Restore(ctx, spec, dir); !errdefs.IsInvalidArgument(err) {
			t.Errorf("restore with other memory: %v, want invalid argument", err)
		}
		if _, err := os.Stat(b.runDir(spec.ID)); !os.IsNotExist(err) {
			t.Errorf("refused restore left its run dir: %v", err)
		}
	})

	t.Run("FreshSecret", func(t *testing.T) {
		spec := testSpec(t)
		r, err := b.Restore(ctx, spec, dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = r.Stop(context.Background())
			_ = b.Cleanup(context.Background(), spec.ID, nil)
		})
		if got := sh(t, r, "cat /tmp/mark; hostname"); got != "before\nsandbox\n" {
			t.Errorf("restored guest: %q, want the snapshot's file", got)
		}
		rs, old := r.(*sandbox), sb.(*sandbox).m.Secret
		if rs.m.Secret == old {
			t.Fatal("the restored sandbox kept the snapshot's secret")
		}
		fresh := rs.m.Secret
		rs.m.Secret = old
		_, err = rs.call(ctx, agentproto.Request{Op: agentproto.OpPing})
		rs.m.Secret = fresh
		if !errdefs.IsPermissionDenied(err) {
			t.Errorf("the snapshot's secret on the restored agent: %v, want permission denied", err)
		}
		if _, err := os.Stat(filepath.Join(b.runDir(spec.ID), diskFile)); err != nil {
			t.Errorf("restored sandbox has no disk of its own: %v", err)
		}
		if got := sh(t, sb, "cat /tmp/mark"); got != "after\n" {
			t.Errorf("the original after the restore: %q", got)
		}
	})
}
