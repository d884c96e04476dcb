package container

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"golang.org/x/sys/unix"
)

func TestExecArgvOutputExit(t *testing.T) {
	s := newSandbox(t, newBackend(t), nil)
	r := run1(t, s, backend.ExecSpec{Argv: []string{"echo", "a b", "c"}})
	if r.stdout != "a b c\n" || r.ExitCode != 0 || r.Signal != 0 {
		t.Fatalf("echo: %+v", r)
	}
	r = sh(t, s, "echo out; echo err >&2; exit 7")
	if r.stdout != "out\n" || r.stderr != "err\n" || r.ExitCode != 7 {
		t.Fatalf("exit 7: %+v", r)
	}
	r = sh(t, s, "kill -TERM $$")
	if r.Signal != int(unix.SIGTERM) || r.ExitCode != -1 || r.OOMKilled {
		t.Fatalf("signal: %+v", r)
	}
	_, err := tryRun(context.Background(), s, backend.ExecSpec{Argv: []string{"no-such-binary"}})
	if !errdefs.IsNotFound(err) {
		t.Fatalf("missing binary: want not found, got %v", err)
	}
	_, err = tryRun(context.Background(), s, backend.ExecSpec{Argv: []string{"true"}, Cwd: "/nope"})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("missing cwd: want invalid argument, got %v", err)
	}
	_, err = tryRun(context.Background(), s, backend.ExecSpec{Argv: []string{"/etc/passwd"}})
	if !errdefs.IsPermissionDenied(err) {
		t.Fatalf("non-executable: want permission denied, got %v", err)
	}
}

func TestExecEnvCwdUserStdin(t *testing.T) {
	s := newSandbox(t, newBackend(t), nil)
	r := run1(t, s, backend.ExecSpec{
		Argv: []string{"sh", "-c", `echo "$FOO"; pwd; id -u; id -g; id -G`},
		Env:  []string{"PATH=/bin", "FOO=bar baz"}, Cwd: "/tmp", User: "agent",
	})
	if want := "bar baz\n/tmp\n1000\n1000\n1000 2000\n"; r.stdout != want {
		t.Fatalf("got %q, want %q", r.stdout, want)
	}
	r = run1(t, s, backend.ExecSpec{Argv: []string{"sh", "-c", "id -u; id -g"}, User: "1234:extra"})
	if r.stdout != "1234\n2000\n" {
		t.Fatalf("uid:group: %q", r.stdout)
	}
	_, err := tryRun(context.Background(), s, backend.ExecSpec{Argv: []string{"true"}, User: "nobody-here"})
	if !errdefs.IsNotFound(err) {
		t.Fatalf("unknown user: want not found, got %v", err)
	}
	r = run1(t, s, backend.ExecSpec{Argv: []string{"sh", "-c", "tr a-z A-Z; echo done"}, Stdin: []byte("hello\n")})
	if r.stdout != "HELLO\ndone\n" {
		t.Fatalf("stdin: %q", r.stdout)
	}
	r = run1(t, s, backend.ExecSpec{Argv: []string{"cat"}})
	if r.stdout != "" || r.ExitCode != 0 {
		t.Fatalf("no stdin must read /dev/null: %+v", r)
	}
}

func TestExecTimeoutKillsGroup(t *testing.T) {
	s := newSandbox(t, newBackend(t), nil)
	r, err := tryRun(context.Background(), s, backend.ExecSpec{
		Argv:    []string{"sh", "-c", "sleep 1000 & echo $!; sleep 1000"},
		Timeout: 300 * time.Millisecond,
	})
	if err != nil || !r.TimedOut || r.Signal != int(unix.SIGKILL) {
		t.Fatalf("timeout: %+v %v", r, err)
	}
	bg := strings.TrimSpace(r.stdout)
	if _, err := strconv.Atoi(bg); err != nil {
		t.Fatalf("background pid %q", bg)
	}
	if r := sh(t, s, "kill -0 "+bg+" 2>/dev/null && echo alive || echo gone"); r.stdout != "gone\n" {
		t.Fatalf("background child of timed-out command: %q", r.stdout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	r, err = tryRun(ctx, s, backend.ExecSpec{Argv: []string{"sleep", "1000"}})
	if err == nil || !r.TimedOut {
		t.Fatalf("ctx cancel: want error and TimedOut, got %+v %v", r, err)
	}
}

func TestExecOutputLimit(t *testing.T) {
	s := newSandbox(t, newBackend(t), nil)
	r, err := tryRun(context.Background(), s, backend.ExecSpec{Argv: []string{"yes"}, OutputLimit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Truncated || len(r.stdout) != 1000 || r.Signal != int(unix.SIGPIPE) {
		t.Fatalf("yes: truncated=%v len=%d signal=%d", r.Truncated, len(r.stdout), r.Signal)
	}
}

func TestExecBackgroundSurvives(t *testing.T) {
	b := newBackend(t)
	s := newSandbox(t, b, nil)
	// The background sleep keeps stdout open: Exec must still return.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := tryRun(ctx, s, backend.ExecSpec{Argv: []string{"sh", "-c", "sleep 1000 & echo started"}})
	if err != nil || r.stdout != "started\n" || r.TimedOut {
		t.Fatalf("background: %+v %v", r, err)
	}
	if r := sh(t, s, "ps -o comm | grep -c ^sleep$"); strings.TrimSpace(r.stdout) != "1" {
		t.Fatalf("background sleep not running: %q", r.stdout)
	}
	g := b.cg.Group(s.ID())
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if g.Exists() {
		t.Fatal("cgroup remains after Stop")
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
}

func TestOutputCallbackError(t *testing.T) {
	s := newSandbox(t, newBackend(t), nil)
	boom := errdefs.Unavailable("client went away")
	_, err := s.Exec(context.Background(), backend.ExecSpec{Argv: []string{"yes"}, Env: []string{"PATH=/bin"}, Cwd: "/", OutputLimit: 1 << 30},
		func(backend.Stream, []byte) error { return boom })
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("want the callback's error, got %v", err)
	}
}
