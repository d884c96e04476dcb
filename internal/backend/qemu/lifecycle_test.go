package qemu

import (
	"context"
	"errors"
	"log/slog"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// fakeVM plays a backend's VM for Lifecycle: its "VMM" is a sleep
// process, hibernating it ends that process (as QEMU quits after the
// save) and a restore starts another. It logs the steps it was asked for.
type fakeVM struct {
	t *testing.T

	mu        sync.Mutex
	vmm       *launch.Process // the process Hibernate ends
	steps     []string
	failSave  bool
	failWait  bool
	exitCause string
}

func (f *fakeVM) step(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps = append(f.steps, s)
}

func (f *fakeVM) took() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := strings.Join(f.steps, " ")
	f.steps = nil
	return s
}

func (f *fakeVM) Halt(context.Context) error        { f.step("halt"); return nil }
func (f *fakeVM) Continue(context.Context) error    { f.step("continue"); return nil }
func (f *fakeVM) DetachAgent(context.Context) error { f.step("detach"); return nil }
func (f *fakeVM) Hibernated() error                 { f.step("hibernated"); return nil }
func (f *fakeVM) Disconnect()                       { f.step("disconnect") }
func (f *fakeVM) ExitReason() string                { return f.exitCause }

func (f *fakeVM) WaitAgent(context.Context, time.Duration) error {
	f.step("wait")
	if f.failWait {
		return errors.New("no answer")
	}
	return nil
}

func (f *fakeVM) Hibernate(context.Context) error {
	f.step("hibernate")
	if f.failSave {
		return errors.New("migration failed")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.vmm.Kill()
}

func (f *fakeVM) Restore(context.Context) (*launch.Process, error) {
	f.step("restore")
	p := startVMM(f.t)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vmm = p
	return p, nil
}

// startVMM starts a stand-in VMM process, killed at the test's end.
func startVMM(t *testing.T) *launch.Process {
	t.Helper()
	var pidfd int
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{PidFD: &pidfd}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p, err := Adopt(cmd.Process, pidfd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	return p
}

func newTestLifecycle(t *testing.T, after time.Duration) (*Lifecycle, *fakeVM) {
	p := startVMM(t)
	f := &fakeVM{t: t, vmm: p, exitCause: "guest kernel panic"}
	l := NewLifecycle(LifecycleConfig{ID: "s1", Ops: f, SnapshotAfter: after, Log: slog.Default()}, p)
	return l, f
}

func ended(l *Lifecycle) bool {
	select {
	case <-l.Done():
		return true
	case <-time.After(100 * time.Millisecond):
		return false
	}
}

// TestLifecyclePauseSnapshotsAndResumeRestores: a pause with SnapshotAfter
// zero halts the vCPUs, detaches the agent with them running, saves the
// state and records it; the VMM's exit that follows does not end the
// sandbox, which refuses calls until a resume restores a new VMM and the
// agent answers.
func TestLifecyclePauseSnapshotsAndResumeRestores(t *testing.T) {
	ctx := context.Background()
	l, f := newTestLifecycle(t, 0)
	first := l.Proc()
	if err := l.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.took(); got != "halt continue detach halt hibernate hibernated" {
		t.Errorf("pause took %q", got)
	}
	if !l.Checkpointed() || l.Proc() != nil {
		t.Fatalf("after the snapshot: checkpointed %v, proc %v", l.Checkpointed(), l.Proc())
	}
	if first.Alive() {
		t.Error("the VMM still runs after its state was saved")
	}
	if ended(l) {
		t.Fatal("the VMM's exit after the snapshot ended the sandbox")
	}
	if err := l.Serving(); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("serving while snapshotted: %v", err)
	}
	if err := l.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.took(); got != "restore wait" {
		t.Errorf("resume took %q", got)
	}
	if err := l.Serving(); err != nil || l.Proc() == nil || l.Proc() == first {
		t.Errorf("after the restore: serving %v, proc %v", err, l.Proc())
	}
	// A second resume has nothing to do.
	if err := l.Resume(ctx); err != nil || f.took() != "" {
		t.Errorf("second resume: %v", err)
	}
}

// TestLifecyclePauseKeepsMemoryUntilSnapshotAfter: a resume before
// SnapshotAfter continues the same VMM and cancels the snapshot; a pause
// left alone is snapshotted when it has passed.
func TestLifecyclePauseKeepsMemoryUntilSnapshotAfter(t *testing.T) {
	ctx := context.Background()
	l, f := newTestLifecycle(t, 300*time.Millisecond)
	p := l.Proc()
	if err := l.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Serving(); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("serving while paused: %v", err)
	}
	if err := l.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if got := f.took(); got != "halt continue" || l.Proc() != p {
		t.Errorf("pause then resume took %q (proc changed: %v)", got, l.Proc() != p)
	}
	if err := l.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !l.Checkpointed() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !l.Checkpointed() {
		t.Fatalf("not snapshotted after SnapshotAfter; steps %q", f.took())
	}
}

// TestLifecycleFailedSnapshotStaysInMemory: a save that fails leaves the
// VM paused with its VMM, whose later exit (nobody asked for it) ends the
// sandbox.
func TestLifecycleFailedSnapshotStaysInMemory(t *testing.T) {
	ctx := context.Background()
	l, f := newTestLifecycle(t, 0)
	f.failSave = true
	if err := l.Pause(ctx); err == nil || !strings.Contains(err.Error(), "migration failed") {
		t.Fatalf("pause with a failing save: %v", err)
	}
	if l.Checkpointed() || l.Proc() == nil {
		t.Fatal("a failed snapshot dropped the VMM")
	}
	_ = l.Proc().Kill()
	if !ended(l) {
		t.Fatal("the VMM's own exit did not end the sandbox")
	}
	if l.ExitReason() != "guest kernel panic" {
		t.Errorf("exit reason %q", l.ExitReason())
	}
	if err := l.Running(); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("running after the end: %v", err)
	}
}

// TestLifecycleStop: a stop kills the VMM and ends the sandbox without an
// exit reason; a stop of a snapshotted VM has no process to kill.
func TestLifecycleStop(t *testing.T) {
	ctx := context.Background()
	l, f := newTestLifecycle(t, -1)
	p := l.Proc()
	if err := l.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if !ended(l) || p.Alive() || l.ExitReason() != "" {
		t.Errorf("after stop: ended %v, vmm alive %v, reason %q", ended(l), p.Alive(), l.ExitReason())
	}
	if got := f.took(); got != "disconnect" {
		t.Errorf("stop took %q", got)
	}

	snap := NewLifecycle(LifecycleConfig{ID: "s2", Ops: f, Log: slog.Default()}, nil)
	if !snap.Checkpointed() {
		t.Error("a lifecycle without a VMM is not snapshotted")
	}
	if err := snap.Stop(ctx); err != nil || !ended(snap) || snap.Checkpointed() {
		t.Errorf("stop of a snapshotted VM: %v", err)
	}
}

// TestLifecycleReattach: an adopted VMM is continued and its agent asked;
// one whose agent does not answer is killed, and the error is NotFound.
func TestLifecycleReattach(t *testing.T) {
	ctx := context.Background()
	l, f := newTestLifecycle(t, -1)
	if err := l.Reattach(ctx, time.Second); err != nil || f.took() != "continue wait" {
		t.Fatalf("reattach: %v", err)
	}
	l, f = newTestLifecycle(t, -1)
	f.failWait = true
	p := l.Proc()
	if err := l.Reattach(ctx, time.Second); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "no answer") {
		t.Fatalf("reattach without an agent: %v", err)
	}
	if !ended(l) || p.Alive() {
		t.Error("a VMM whose agent does not answer was left running")
	}
}
