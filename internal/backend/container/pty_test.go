package container

import (
	"context"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"golang.org/x/sys/unix"
)

// TestExecPTYStarted checks a PTY exec: the command is a session leader
// on a terminal of the sandbox's own devpts, its input comes from
// StdinReader, Started hands out a handle that resizes and signals it.
func TestExecPTYStarted(t *testing.T) {
	s := newSandbox(t, newBackend(t), nil)
	if _, ok := s.(backend.Interactive); !ok {
		t.Fatal("container sandboxes must implement backend.Interactive")
	}
	inR, inW := io.Pipe()
	started := make(chan backend.Process, 1)
	out := make(chan string, 64)
	done := make(chan backend.ExecResult, 1)
	go func() {
		res, err := s.Exec(context.Background(), backend.ExecSpec{
			Argv: []string{"sh"}, Env: []string{"PATH=/bin"}, Cwd: "/", OutputLimit: 1 << 20,
			PTY: &backend.TermSize{Cols: 80, Rows: 24}, StdinReader: inR,
			Started: func(p backend.Process) { started <- p },
		}, func(st backend.Stream, p []byte) error {
			if st != backend.Stdout {
				t.Errorf("PTY output on stream %d", st)
			}
			out <- string(p)
			return nil
		})
		if err != nil {
			t.Errorf("exec: %v", err)
		}
		done <- res
	}()
	p := <-started
	var seen strings.Builder
	expect := func(re string) {
		t.Helper()
		rx := regexp.MustCompile(re)
		deadline := time.After(10 * time.Second)
		for !rx.MatchString(seen.String()) {
			select {
			case chunk := <-out:
				seen.WriteString(chunk)
			case <-deadline:
				t.Fatalf("no %q in terminal output %q", re, seen.String())
			}
		}
	}
	send := func(line string) {
		t.Helper()
		if _, err := inW.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	send("stty size; tty; echo sid=$(cut -d' ' -f6 /proc/self/stat)\n")
	expect(`24 80`)
	expect(`/dev/pts/\d+`)
	expect(`sid=` + strconv.Itoa(p.Pid()))
	if err := p.Resize(backend.TermSize{Cols: 132, Rows: 40}); err != nil {
		t.Fatal(err)
	}
	send("stty size\n")
	expect(`40 132`)
	if err := p.Resize(backend.TermSize{}); err == nil {
		t.Fatal("resize to 0x0 succeeded")
	}
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
	inW.Close()
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
