package backendtest

import (
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

func (st *suite) createErrors(t *testing.T) {
	for _, id := range []string{"", "a/b", "..", strings.Repeat("x", backend.MaxIDLen+1)} {
		spec := st.h.Spec(t)
		spec.ID = id
		if s, err := st.b.Create(st.ctx(t), spec); !errdefs.IsInvalidArgument(err) {
			if err == nil {
				st.cleanup(t, id, s.Record())
			}
			t.Errorf("create with id %q: %v; want invalid argument", id, err)
		}
	}
	if _, err := st.b.Recover(st.ctx(t), "never-made", nil); !errdefs.IsNotFound(err) {
		t.Errorf("recover of an unknown id: %v; want not found", err)
	}
	if err := st.b.Cleanup(st.ctx(t), "never-made", nil); err != nil {
		t.Errorf("cleanup of an unknown id: %v; want nil (idempotent)", err)
	}
}

// memoryLimit: a command that outgrows the sandbox's memory is killed
// and flagged, and the sandbox keeps serving.
func (st *suite) memoryLimit(t *testing.T) {
	r, err := st.tryRun(st.ctx(t), backend.ExecSpec{Argv: []string{"awk", "BEGIN { s = \"xxxxxxxxxxxxxxxx\"; while (1) s = s s }"}})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OOMKilled || r.Signal != sigKILL {
		t.Errorf("memory bomb: %+v; want OOMKilled and SIGKILL", r.ExecResult)
	}
	if got := st.sh(t, "echo still-here"); got != "still-here\n" {
		t.Errorf("after OOM: %q", got)
	}
}

// startCounter starts a loop that bumps /tmp/c (by rename, so a read
// never sees it half written) and returns its pid once it has counted.
func (st *suite) startCounter(t *testing.T) string {
	t.Helper()
	// A counter file left by an earlier subtest in the same guest would
	// pass the wait below before this counter wrote, with a stale value.
	return strings.TrimSpace(st.sh(t, "rm -f /tmp/c /tmp/c.n; (i=0; while true; do i=$((i+1)); echo $i > /tmp/c.n; mv /tmp/c.n /tmp/c; sleep 0.05; done) >/dev/null 2>&1 & echo $!; while [ ! -s /tmp/c ]; do sleep 0.05; done"))
}

func (st *suite) waitCounterPast(t *testing.T, v string) {
	t.Helper()
	deadline := time.Now().Add(st.h.timeout())
	for st.readFile(t, "/tmp/c", 0, 0) == v {
		if time.Now().After(deadline) {
			t.Fatal("counter does not advance after resume")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pauseResume: pause and resume are idempotent, and a process started
// before the pause goes on after the resume with its files.
func (st *suite) pauseResume(t *testing.T) {
	ctx := st.ctx(t)
	pid := st.startCounter(t)
	defer st.sh(t, "kill "+pid)
	v := st.readFile(t, "/tmp/c", 0, 0)
	for i := 0; i < 2; i++ {
		if err := st.s.Pause(ctx); err != nil {
			t.Fatalf("pause %d: %v", i+1, err)
		}
	}
	for i := 0; i < 2; i++ {
		if err := st.s.Resume(ctx); err != nil {
			t.Fatalf("resume %d: %v", i+1, err)
		}
	}
	st.waitCounterPast(t, v)
	if got := st.sh(t, "echo ok"); got != "ok\n" {
		t.Errorf("exec after resume: %q", got)
	}
}

// pausedStandsStill: while paused the counter does not move, however
// long we wait (read through the file calls, which such a backend serves
// from outside the frozen processes).
func (st *suite) pausedStandsStill(t *testing.T) {
	if st.h.NoCallsWhilePaused != "" {
		t.Skip(st.h.NoCallsWhilePaused)
	}
	ctx := st.ctx(t)
	pid := st.startCounter(t)
	defer st.sh(t, "kill "+pid)
	if err := st.s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	v1 := st.readFile(t, "/tmp/c", 0, 0)
	time.Sleep(500 * time.Millisecond)
	v2 := st.readFile(t, "/tmp/c", 0, 0)
	if err := st.s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if v1 != v2 {
		t.Errorf("counter advanced while paused: %s -> %s", v1, v2)
	}
	st.waitCounterPast(t, v2)
}

// duplicateID: a second create with a live sandbox's ID fails as
// already existing and leaves the live one alone.
func (st *suite) duplicateID(t *testing.T) {
	spec := st.h.Spec(t)
	spec.ID = st.s.ID()
	if _, err := st.b.Create(st.ctx(t), spec); !errdefs.IsAlreadyExists(err) {
		t.Errorf("create with a live sandbox's id: %v; want already exists", err)
	}
	if got := st.sh(t, "echo unharmed"); got != "unharmed\n" {
		t.Errorf("the live sandbox after a duplicate create: %q", got)
	}
}

// resettable: a Spec.Resettable sandbox implements Resetter, and a reset
// forgets what a command wrote; a backend without fncall pools refuses
// the spec as not supported.
func (st *suite) resettable(t *testing.T) {
	spec := st.h.Spec(t)
	spec.Resettable = true
	spec.Resources.DiskBytes = 16 << 20
	s, err := st.b.Create(st.ctx(t), spec)
	if errdefs.IsNotSupported(err) {
		t.Skipf("backend refuses resettable sandboxes: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.cleanup(t, spec.ID, s.Record()) })
	rs, ok := s.(backend.Resetter)
	if !ok {
		t.Fatalf("a resettable sandbox (%T) does not implement backend.Resetter", s)
	}
	if _, err := s.WriteFile(st.ctx(t), "/tmp/call1", strings.NewReader("x"), backend.WriteOptions{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.Reset(st.ctx(t), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(st.ctx(t), "/tmp/call1"); !errdefs.IsNotFound(err) {
		t.Errorf("a file of the call before the reset: %v; want not found", err)
	}
}

// stop: Stop ends every process of a sandbox (Done closes), later calls
// fail as a failed precondition, a second Stop is a no-op, and Cleanup
// then leaves nothing.
func (st *suite) stop(t *testing.T) {
	spec := st.h.Spec(t)
	s, err := st.b.Create(st.ctx(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.cleanup(t, spec.ID, s.Record()) })
	if _, err := s.Exec(st.ctx(t), backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "sleep 1000 >/dev/null 2>&1 &"},
		Env: []string{"PATH=/bin:/usr/bin"}, Cwd: "/", OutputLimit: 1 << 10}, func(backend.Stream, []byte) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := s.Stop(st.ctx(t)); err != nil {
			t.Fatalf("stop %d: %v", i+1, err)
		}
	}
	select {
	case <-s.Done():
	case <-time.After(st.h.timeout()):
		t.Fatal("Done not closed after Stop")
	}
	_, err = s.Exec(st.ctx(t), backend.ExecSpec{Argv: []string{"true"}, Env: []string{"PATH=/bin"}, Cwd: "/"},
		func(backend.Stream, []byte) error { return nil })
	if !errdefs.IsFailedPrecondition(err) {
		t.Errorf("exec after Stop: %v; want failed precondition", err)
	}
	if _, err := s.Stat(st.ctx(t), "/"); err == nil {
		t.Error("stat after Stop succeeded")
	}
}

// restartRecovery: a new backend over the same host state (a restarted
// daemon) re-attaches to the shared sandbox with its files and processes;
// Sweep then removes it (no record kept) and leaves nothing behind;
// Cleanup afterwards and Recover of the removed sandbox behave.
func (st *suite) restartRecovery(t *testing.T) {
	ctx := st.ctx(t)
	old := st.s
	id, rec := old.ID(), old.Record()
	pid := strings.TrimSpace(st.sh(t, "echo kept > /root/mark; sleep 1000 >/dev/null 2>&1 & echo $!"))
	if st.h.Detach != nil {
		st.h.Detach(old)
	}
	b2 := st.h.New(t)
	s2, err := b2.Recover(ctx, id, rec)
	if err != nil {
		t.Fatalf("recover: %v", err)
	}
	st.s = s2
	if got := st.sh(t, "cat /root/mark; kill -0 "+pid+" && echo running"); got != "kept\nrunning\n" {
		t.Errorf("recovered sandbox: %q; want its file and its background process", got)
	}
	if err := b2.Sweep(ctx, func(other string) bool { return other != id }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s2.Done():
	case <-time.After(st.h.timeout()):
		t.Error("Done not closed after Sweep removed the sandbox")
	}
	st.assertGone(t, id)
	if err := b2.Cleanup(ctx, id, rec); err != nil {
		t.Errorf("cleanup after sweep: %v", err)
	}
	if err := b2.Cleanup(ctx, id, nil); err != nil {
		t.Errorf("cleanup without a record: %v", err)
	}
	if _, err := b2.Recover(ctx, id, rec); !errdefs.IsNotFound(err) {
		t.Errorf("recover after cleanup: %v; want not found", err)
	}
	st.assertGone(t, id)
}
