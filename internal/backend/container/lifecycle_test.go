package container

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

var strconvItoa = strconv.Itoa

// assertGone checks that nothing of sandbox id remains on the host: its
// cgroup, run dir, upper dir, mounts, and init (pid, when known).
func assertGone(t *testing.T, b *Backend, id string, pid int) {
	t.Helper()
	for _, l := range leftovers(b, id) {
		t.Errorf("%s: %s remains", id, l)
	}
	if pid > 0 {
		if st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); strings.Contains(string(st), "corral-init") {
			t.Errorf("%s: init %d still alive", id, pid)
		}
	}
}

func TestCleanupLeavesNothing(t *testing.T) {
	b := newBackend(t)
	spec := defaultSpec(newID(t))
	ctx := context.Background()
	s := createBare(t, b, spec)
	pid := s.(*sandbox).proc.Pid
	sh(t, s, "sleep 1000 >/dev/null 2>&1 & echo x > /tmp/f")
	mi, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if !strings.Contains(string(mi), "overlay") {
		t.Fatalf("no overlay in sandbox mountinfo:\n%s", mi)
	}
	if hm, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(hm), spec.ID) {
		t.Fatal("sandbox mount visible on the host")
	}
	if err := b.Cleanup(ctx, spec.ID, s.Record()); err != nil {
		t.Fatal(err)
	}
	assertGone(t, b, spec.ID, pid)
	if err := b.Cleanup(ctx, spec.ID, s.Record()); err != nil {
		t.Fatalf("second cleanup: %v", err)
	}
	if err := b.Cleanup(ctx, spec.ID, nil); err != nil {
		t.Fatalf("cleanup without record: %v", err)
	}
}

func TestCreateFailureAtEachStep(t *testing.T) {
	b := newBackend(t)
	defer func() { failStep = "" }()
	for _, st := range createSteps {
		failStep = st.Name
		id := newID(t)
		spec := defaultSpec(id)
		if _, err := b.Create(context.Background(), spec); err == nil || !strings.Contains(err.Error(), st.Name) {
			t.Fatalf("step %s: want injected failure, got %v", st.Name, err)
		}
		assertGone(t, b, id, 0)
	}
	failStep = ""
	// A real failure inside init (missing layer) and a cancelled context.
	spec := defaultSpec(newID(t))
	spec.Layers = []string{"/nonexistent-layer"}
	if _, err := b.Create(context.Background(), spec); err == nil || !strings.Contains(err.Error(), "layer: idmap /nonexistent-layer") {
		t.Fatalf("bad layer: %v", err)
	}
	assertGone(t, b, spec.ID, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	spec = defaultSpec(newID(t))
	if _, err := b.Create(ctx, spec); err == nil {
		t.Fatal("cancelled create succeeded")
	}
	assertGone(t, b, spec.ID, 0)
}

func TestRecoverAfterRestart(t *testing.T) {
	b := newBackend(t)
	spec := defaultSpec(newID(t))
	ctx := context.Background()
	s := createBare(t, b, spec)
	rec := s.Record()
	// Also when the test fails before its own Cleanup (a no-op after it).
	t.Cleanup(func() { _ = b.Cleanup(context.Background(), spec.ID, rec) })
	sh(t, s, "echo kept > /tmp/state")
	s = nil // the old daemon's object is gone

	b2 := newBackend(t)
	s2, err := b2.Recover(ctx, spec.ID, rec)
	if err != nil {
		t.Fatal(err)
	}
	if r := sh(t, s2, "cat /tmp/state"); r.stdout != "kept\n" {
		t.Fatalf("recovered sandbox: %q", r.stdout)
	}
	checkConnKept(t, s2, false) // PID 1 is the stub
	if _, err := b2.Recover(ctx, spec.ID, []byte(`{"pid":1,"start_time":1}`)); !errdefs.IsNotFound(err) {
		t.Fatalf("foreign pid: want not found, got %v", err)
	}
	if err := b2.Cleanup(ctx, spec.ID, rec); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s2.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after cleanup")
	}
	if _, err := b2.Recover(ctx, spec.ID, rec); !errdefs.IsNotFound(err) {
		t.Fatalf("after cleanup: want not found, got %v", err)
	}
	assertGone(t, b2, spec.ID, 0)
}

func TestSweep(t *testing.T) {
	b := newBackend(t)
	keepS := newSandbox(t, b, nil)
	spec := defaultSpec(newID(t))
	dropS, err := b.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	pid := dropS.(*sandbox).proc.Pid
	err = b.Sweep(context.Background(), func(id string) bool { return id != spec.ID })
	if err != nil {
		t.Fatal(err)
	}
	assertGone(t, b, spec.ID, pid)
	if r := sh(t, keepS, "echo ok"); r.stdout != "ok\n" {
		t.Fatal("kept sandbox broken by sweep")
	}
}

// TestCommandsAreTheOOMVictims: the commands init starts, as root or as
// another user, have oom_score_adj 1000, so an OOM kill in the sandbox
// takes one of them before init (which stays at -1000 where the node
// has CAP_SYS_RESOURCE, at 0 where it has not, as on this test host).
func TestCommandsAreTheOOMVictims(t *testing.T) {
	b := newBackend(t)
	s := createBare(t, b, defaultSpec(newID(t)))
	defer s.Stop(context.Background())
	adj, err := os.ReadFile("/proc/" + strconv.Itoa(s.(*sandbox).proc.Pid) + "/oom_score_adj")
	if err != nil || (strings.TrimSpace(string(adj)) != "0" && strings.TrimSpace(string(adj)) != "-1000") {
		t.Errorf("init's oom_score_adj %q %v, want -1000 or 0", adj, err)
	}
	for _, user := range []string{"", "1000"} {
		// Init sets the score just after the fork: the command reads its
		// own a moment later.
		r := run1(t, s, backend.ExecSpec{Argv: []string{"sh", "-c", "sleep 0.2; cat /proc/$$/oom_score_adj"}, User: user})
		if strings.TrimSpace(r.stdout) != "1000" {
			t.Errorf("a command's (user %q) oom_score_adj %q (stderr %q), want 1000", user, r.stdout, r.stderr)
		}
	}
}
