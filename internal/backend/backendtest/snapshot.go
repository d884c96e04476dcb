package backendtest

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

// snapshotRestore: a snapshot of the running shared sandbox, restored into
// a new sandbox, carries its files and its running processes (a counter
// goes on from at least the snapshotted value), while the original keeps
// running. A backend without snapshots says so by not implementing
// backend.Snapshotter and backend.Restorer (the node then answers
// NotSupported), and the subtest skips naming that.
func (st *suite) snapshotRestore(t *testing.T) {
	snap, ok := st.s.(backend.Snapshotter)
	restorer, rok := st.b.(backend.Restorer)
	if !ok || !rok {
		t.Skipf("%T / %T: no backend.Snapshotter and backend.Restorer (the node refuses snapshots of this backend as not supported)", st.s, st.b)
	}
	ctx := st.ctx(t)
	pid := st.startCounter(t)
	defer st.sh(t, "kill "+pid)
	st.sh(t, "echo before-snapshot > /root/snapmark")
	at, err := strconv.Atoi(strings.TrimSpace(st.readFile(t, "/tmp/c", 0, 0)))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bytes, err := snap.SnapshotTo(ctx, dir)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if bytes <= 0 {
		t.Errorf("snapshot of a running sandbox occupies %d bytes", bytes)
	}
	st.waitCounterPast(t, st.readFile(t, "/tmp/c", 0, 0)) // the original runs on

	spec := st.spec
	spec.ID = st.h.Spec(t).ID
	restored, err := restorer.Restore(ctx, spec, dir)
	if err != nil {
		t.Fatalf("restore into %s: %v", spec.ID, err)
	}
	t.Cleanup(func() { st.cleanup(t, spec.ID, restored.Record()) })
	if restored.ID() != spec.ID {
		t.Errorf("restored sandbox id %q; want %q", restored.ID(), spec.ID)
	}
	rs := &suite{h: st.h, b: st.b, s: restored, spec: spec}
	if got := rs.readFile(t, "/root/snapmark", 0, 0); got != "before-snapshot\n" {
		t.Errorf("a file written before the snapshot, in the restored sandbox: %q", got)
	}
	first := strings.TrimSpace(rs.readFile(t, "/tmp/c", 0, 0))
	n, err := strconv.Atoi(first)
	if err != nil || n < at {
		t.Errorf("restored counter %q; want at least %d, its value before the snapshot", first, at)
	}
	deadline := time.Now().Add(st.h.timeout())
	for strings.TrimSpace(rs.readFile(t, "/tmp/c", 0, 0)) == first {
		if time.Now().After(deadline) {
			t.Fatal("the restored counter does not advance: its process did not come along")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
