package backendtest

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// Signal numbers as ExecResult.Signal reports them (Linux, every arch).
const sigKILL, sigTERM, sigPIPE = 9, 15, 13

func (st *suite) exec(t *testing.T) {
	r := st.run(t, backend.ExecSpec{Argv: []string{"echo", "a b", "c"}})
	if r.stdout != "a b c\n" || r.ExitCode != 0 || r.Signal != 0 || r.Truncated || r.TimedOut {
		t.Errorf("echo: %+v", r)
	}
	r = st.run(t, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 7"}})
	if r.stdout != "out\n" || r.stderr != "err\n" || r.ExitCode != 7 {
		t.Errorf("exit 7: %+v", r)
	}
	r = st.run(t, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "kill -TERM $$"}})
	if r.Signal != sigTERM || r.ExitCode != -1 || r.OOMKilled {
		t.Errorf("killed by SIGTERM: %+v; want signal 15, exit -1", r)
	}
	r = st.run(t, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "echo via-shell"}, Shell: true})
	if r.stdout != "via-shell\n" || r.ExitCode != 0 {
		t.Errorf("shell command: %+v", r)
	}
}

func (st *suite) execEnvCwdUser(t *testing.T) {
	r := st.run(t, backend.ExecSpec{
		Argv: []string{"/bin/sh", "-c", `echo "$FOO"; pwd; id -u; id -g`},
		Env:  []string{"PATH=/bin:/usr/bin", "FOO=bar baz"}, Cwd: "/tmp", User: "nobody",
	})
	if want := "bar baz\n/tmp\n65534\n65534\n"; r.stdout != want {
		t.Errorf("env, cwd, user nobody: %q, want %q", r.stdout, want)
	}
	r = st.run(t, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "id -u; id -g"}, User: "1234:5678"})
	if r.stdout != "1234\n5678\n" {
		t.Errorf("user 1234:5678: %q", r.stdout)
	}
}

func (st *suite) execErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		spec backend.ExecSpec
		is   func(error) bool
		want string
	}{
		{"missing binary", backend.ExecSpec{Argv: []string{"no-such-binary"}}, errdefs.IsNotFound, "not found"},
		{"missing path", backend.ExecSpec{Argv: []string{"/no/such/binary"}}, errdefs.IsNotFound, "not found"},
		{"missing cwd", backend.ExecSpec{Argv: []string{"true"}, Cwd: "/nope"}, errdefs.IsInvalidArgument, "invalid argument"},
		{"not executable", backend.ExecSpec{Argv: []string{"/etc/passwd"}}, errdefs.IsPermissionDenied, "permission denied"},
		{"unknown user", backend.ExecSpec{Argv: []string{"true"}, User: "nobody-here"}, errdefs.IsNotFound, "not found"},
	} {
		if _, err := st.tryRun(st.ctx(t), c.spec); !c.is(err) {
			t.Errorf("%s: %v; want %s", c.name, err, c.want)
		}
	}
	if got := st.sh(t, "echo still-serving"); got != "still-serving\n" {
		t.Errorf("after failed execs: %q", got)
	}
}

func (st *suite) stdin(t *testing.T) {
	r := st.run(t, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "tr a-z A-Z; echo done"}, Stdin: []byte("hello\n")})
	if r.stdout != "HELLO\ndone\n" {
		t.Errorf("stdin: %q", r.stdout)
	}
	r = st.run(t, backend.ExecSpec{Argv: []string{"cat"}})
	if r.stdout != "" || r.ExitCode != 0 {
		t.Errorf("without stdin cat must read end-of-file at once: %+v", r)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB, many frames
	r = st.run(t, backend.ExecSpec{Argv: []string{"wc", "-c"}, Stdin: big})
	if strings.TrimSpace(r.stdout) != strconv.Itoa(len(big)) {
		t.Errorf("1 MiB of stdin: wc -c says %q", r.stdout)
	}
}

// streaming: output reaches the caller while the command runs, and input
// fed through StdinReader reaches the command while it runs: the command
// waits for a line that the test sends only after it saw the first output.
func (st *suite) streaming(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	sawReady := make(chan struct{})
	var once sync.Once
	var out bytes.Buffer
	var mu sync.Mutex
	type done struct {
		r   backend.ExecResult
		err error
	}
	ended := make(chan done, 1)
	go func() {
		r, err := st.s.Exec(st.ctx(t), backend.ExecSpec{
			Argv: []string{"/bin/sh", "-c", "echo ready; read line; echo got:$line"},
			Env:  []string{"PATH=/bin:/usr/bin"}, Cwd: "/", OutputLimit: 1 << 20, StdinReader: pr,
		}, func(_ backend.Stream, p []byte) error {
			mu.Lock()
			out.Write(p)
			if strings.Contains(out.String(), "ready\n") {
				once.Do(func() { close(sawReady) })
			}
			mu.Unlock()
			return nil
		})
		ended <- done{r, err}
	}()
	select {
	case <-sawReady:
	case d := <-ended:
		t.Fatalf("command ended before the test sent its input: %+v %v, output %q", d.r, d.err, out.String())
	case <-time.After(st.h.timeout()):
		t.Fatal("no output while the command runs")
	}
	if _, err := pw.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	d := <-ended
	if d.err != nil || d.r.ExitCode != 0 {
		t.Fatalf("streaming command: %+v %v", d.r, d.err)
	}
	if got := out.String(); got != "ready\ngot:ping\n" {
		t.Errorf("output %q, want ready then got:ping", got)
	}
}

// background: a command's background child keeps running (and holding
// the output pipe) after the command exits, and Exec still returns.
func (st *suite) background(t *testing.T) {
	r := st.run(t, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "sleep 1000 & echo $!"}})
	pid := strings.TrimSpace(r.stdout)
	if _, err := strconv.Atoi(pid); err != nil || r.TimedOut {
		t.Fatalf("background: %+v", r)
	}
	if got := st.sh(t, "kill -0 "+pid+" && echo alive; kill "+pid); got != "alive\n" {
		t.Errorf("background sleep after its command ended: %q", got)
	}
}

// timeoutKills: a timeout or a cancelled context kills the command's
// whole process group.
func (st *suite) timeoutKills(t *testing.T) {
	r, err := st.tryRun(st.ctx(t), backend.ExecSpec{
		Argv:    []string{"/bin/sh", "-c", "sleep 1000 & echo $!; sleep 1000"},
		Timeout: 2 * time.Second,
	})
	if err != nil || !r.TimedOut || r.Signal != sigKILL {
		t.Fatalf("timeout: %+v %v; want TimedOut and SIGKILL", r, err)
	}
	bg := strings.TrimSpace(r.stdout)
	if _, err := strconv.Atoi(bg); err != nil {
		t.Fatalf("background pid %q", bg)
	}
	if got := st.sh(t, "for i in 1 2 3 4 5 6 7 8 9 10; do kill -0 "+bg+" 2>/dev/null || break; sleep 0.2; done; kill -0 "+bg+" 2>/dev/null && echo alive || echo gone"); got != "gone\n" {
		t.Errorf("background child of the timed-out command: %q", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err = st.tryRun(ctx, backend.ExecSpec{Argv: []string{"sleep", "1000"}})
	if err == nil || !r.TimedOut {
		t.Errorf("cancelled context: %+v %v; want an error and TimedOut", r, err)
	}
}

func (st *suite) outputLimit(t *testing.T) {
	r, err := st.tryRun(st.ctx(t), backend.ExecSpec{Argv: []string{"yes"}, OutputLimit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Truncated || len(r.stdout) != 100000 || r.TimedOut || r.Signal != sigPIPE {
		t.Errorf("yes: truncated=%v len=%d timedout=%v signal=%d; want cut at 100000 by SIGPIPE",
			r.Truncated, len(r.stdout), r.TimedOut, r.Signal)
	}
	r = st.run(t, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "echo 12345; echo 67890 >&2"}, OutputLimit: 8})
	if got := r.stdout + r.stderr; len(got) != 8 || !r.Truncated {
		t.Errorf("stdout+stderr share the cap: %q %q truncated=%v", r.stdout, r.stderr, r.Truncated)
	}
}

func (st *suite) outputCallbackError(t *testing.T) {
	boom := errdefs.Unavailable("client went away")
	_, err := st.s.Exec(st.ctx(t), backend.ExecSpec{Argv: []string{"yes"}, Env: []string{"PATH=/bin:/usr/bin"}, Cwd: "/", OutputLimit: 1 << 30},
		func(backend.Stream, []byte) error { return boom })
	if !errdefs.IsUnavailable(err) {
		t.Errorf("want the callback's error, got %v", err)
	}
	if got := st.sh(t, "echo ok"); got != "ok\n" {
		t.Errorf("after a failed callback: %q", got)
	}
}
