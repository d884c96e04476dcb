package container

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"golang.org/x/sys/unix"
)

// TestExecPTYSignal checks what the conformance suite's Terminal subtest
// leaves out: the handle Started hands out for a PTY exec signals the
// command, and the exec ends with that signal.
func TestExecPTYSignal(t *testing.T) {
	s := newSandbox(t, newBackend(t), nil)
	inR, inW := io.Pipe()
	defer inW.Close()
	started := make(chan backend.Process, 1)
	done := make(chan backend.ExecResult, 1)
	go func() {
		res, err := s.Exec(context.Background(), backend.ExecSpec{
			Argv: []string{"sh"}, Env: []string{"PATH=/bin"}, Cwd: "/", OutputLimit: 1 << 20,
			PTY: &backend.TermSize{Cols: 80, Rows: 24}, StdinReader: inR,
			Started: func(p backend.Process) { started <- p },
		}, func(backend.Stream, []byte) error { return nil })
		if err != nil {
			t.Errorf("exec: %v", err)
		}
		done <- res
	}()
	p := <-started
	if err := p.Signal(int(unix.SIGKILL)); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res.Signal != int(unix.SIGKILL) {
			t.Fatalf("after SIGKILL: %+v", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("exec did not end after SIGKILL")
	}
}

// TestRenameAndWatch checks the container's Renamer and Watcher.
func TestRenameAndWatch(t *testing.T) {
	s := newSandbox(t, newBackend(t), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := s.(backend.Watcher)
	events := make(chan backend.WatchEvent, 16)
	ready := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- w.WatchDir(ctx, "/tmp", false, func() { close(ready) }, func(ev backend.WatchEvent) { events <- ev })
	}()
	<-ready
	sh(t, s, "echo x > /tmp/a")
	if err := s.(backend.Renamer).Rename(ctx, "/tmp/a", "/tmp/b"); err != nil {
		t.Fatal(err)
	}
	if r := sh(t, s, "cat /tmp/b"); r.stdout != "x\n" {
		t.Fatalf("renamed file: %+v", r)
	}
	want := map[backend.WatchEvent]bool{{Name: "a", Op: backend.WatchCreate}: true, {Name: "a", Op: backend.WatchRename}: true, {Name: "b", Op: backend.WatchCreate}: true}
	deadline := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case ev := <-events:
			delete(want, ev)
		case <-deadline:
			t.Fatalf("missing watch events %v", want)
		}
	}
	// The watch ends with the sandbox.
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("watch after stop: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end with the sandbox")
	}
}
