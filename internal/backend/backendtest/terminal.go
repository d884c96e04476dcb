package backendtest

import (
	"context"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// terminal: an interactive exec (backend.Interactive) on a terminal, as
// the node's long-running processes use it.
func (st *suite) terminal(t *testing.T) {
	if _, ok := st.s.(backend.Interactive); !ok {
		t.Skip("not supported: the backend's sandboxes do not implement backend.Interactive (the node refuses terminals and long-running processes on it)")
	}
	CheckTerminal(t, st.s.Exec, st.h.timeout())
}

// ExecFunc is backend.Sandbox.Exec or what stands for it.
type ExecFunc func(ctx context.Context, spec backend.ExecSpec, out backend.OutputFunc) (backend.ExecResult, error)

// CheckTerminal runs an interactive /bin/sh on a terminal of 80x24: tty
// names a /dev/pts device, stty size shows the size asked for and, after
// a resize, the new one; the shell is its session's leader (the pid
// Started gave); stdin reaches it; its exit status comes back. A backend
// (or its guest) without terminals must refuse with errdefs.NotSupported,
// and the test skips with that error.
func CheckTerminal(t *testing.T, exec ExecFunc, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	inR, inW := io.Pipe()
	defer inW.Close()
	started := make(chan backend.Process, 1)
	out := make(chan string, 256)
	type result struct {
		res backend.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := exec(ctx, backend.ExecSpec{
			Argv: []string{"/bin/sh"}, Env: []string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin", "PS1=$ "},
			Cwd: "/", OutputLimit: 1 << 20, Timeout: timeout,
			PTY: &backend.TermSize{Cols: 80, Rows: 24}, StdinReader: inR,
			Started: func(p backend.Process) { started <- p },
		}, func(s backend.Stream, p []byte) error {
			if s != backend.Stdout {
				t.Errorf("terminal output on stream %d, want stdout", s)
			}
			out <- string(p)
			return nil
		})
		done <- result{res, err}
	}()
	var p backend.Process
	select {
	case p = <-started:
	case r := <-done:
		if errdefs.IsNotSupported(r.err) {
			t.Skip(r.err)
		}
		t.Fatalf("terminal exec ended before it started: %+v %v", r.res, r.err)
	}
	var seen strings.Builder
	expect := func(re string) {
		t.Helper()
		rx := regexp.MustCompile(re)
		for !rx.MatchString(seen.String()) {
			select {
			case chunk := <-out:
				seen.WriteString(chunk)
			case r := <-done:
				t.Fatalf("exec ended (%+v %v) without %q in terminal output %q", r.res, r.err, re, seen.String())
			case <-ctx.Done():
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
	// The patterns match the commands' output, not the terminal's echo of
	// their input (nor the prompt, which may come before or after it).
	send("tty; stty size; echo sid=$(cut -d' ' -f6 /proc/self/stat)\n")
	expect(`/dev/pts/\d+\r?\n`)
	expect(`\b24 80\r?\n`)
	expect(`\bsid=` + strconv.Itoa(p.Pid()) + `\r?\n`)
	if err := p.Resize(backend.TermSize{Cols: 132, Rows: 40}); err != nil {
		t.Fatal(err)
	}
	send("stty size\n")
	expect(`\b40 132\r?\n`)
	if err := p.Resize(backend.TermSize{}); err == nil {
		t.Error("resize to 0x0 succeeded")
	}
	send("read line; echo got-$line\n")
	send("hello\n")
	expect(`got-hello\r?\n`)
	send("exit 7\n")
	select {
	case r := <-done:
		if r.err != nil || r.res.ExitCode != 7 {
			t.Fatalf("after exit 7: %+v %v", r.res, r.err)
		}
	case <-ctx.Done():
		t.Fatalf("the shell did not exit; terminal output %q", seen.String())
	}
}
