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

// threadsOf returns the sandbox's tasks (threads of every process) by pid.
func threadsOf(t *testing.T, b *Backend, s backend.Sandbox) map[int]int {
	t.Helper()
	procs, err := b.cg.Group(s.ID()).Procs()
	if err != nil {
		t.Fatal(err)
	}
	n := map[int]int{}
	for _, p := range procs {
		ents, err := os.ReadDir("/proc/" + strconv.Itoa(p) + "/task")
		if err == nil {
			n[p] = len(ents)
		}
	}
	return n
}

func cmdline(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return strings.Join(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")[:1], "")
}

// TestIdleSandboxIsTheStub checks that an idle sandbox is one task, the
// stub as its init; that an exec starts corral-init's server beside it;
// and that the server is gone again after its linger.
func TestIdleSandboxIsTheStub(t *testing.T) {
	b := newBackend(t)
	s := newSandbox(t, b, nil)
	pid := s.(*sandbox).proc.Pid
	idle := func() bool {
		tasks := threadsOf(t, b, s)
		return len(tasks) == 1 && tasks[pid] == 1
	}
	if !idle() {
		t.Fatalf("fresh sandbox: tasks %v, want only init %d with one thread", threadsOf(t, b, s), pid)
	}
	if got := cmdline(pid); got != "corral-initstub" {
		t.Fatalf("init runs %q, want corral-initstub", got)
	}
	// Ping and kill are the stub's own: no server starts for them.
	ctx := context.Background()
	if err := s.(*sandbox).client.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.(*sandbox).client.Kill(ctx, 4242, 15); err != nil {
		t.Fatalf("kill of a gone group: %v", err)
	}
	if !idle() {
		t.Fatalf("after ping and kill: tasks %v", threadsOf(t, b, s))
	}
	if r := sh(t, s, "echo ok"); r.stdout != "ok\n" {
		t.Fatalf("exec: %q", r.stdout)
	}
	var server int
	for p := range threadsOf(t, b, s) {
		if p != pid && cmdline(p) == "corral-init" {
			server = p
		}
	}
	if server == 0 {
		t.Fatalf("after an exec: tasks %v, no server", threadsOf(t, b, s))
	}
	deadline := time.Now().Add(serverLinger + 5*time.Second)
	for !idle() {
		if time.Now().After(deadline) {
			t.Fatalf("server still there %v after its linger: tasks %v", serverLinger, threadsOf(t, b, s))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A sandbox root's kill -9 -1 kills the server carrying it: the stub
	// reports the exit, and the next exec starts another server.
	if r := sh(t, s, "kill -9 -1; echo ok"); r.stdout != "ok\n" {
		t.Fatalf("kill -9 -1: %q", r.stdout)
	}
	if r := sh(t, s, "echo again"); r.stdout != "again\n" {
		t.Fatalf("exec after kill -9 -1: %q", r.stdout)
	}
}

// serverLinger is how long corral-init's server waits for work (initproc).
const serverLinger = 2 * time.Second

// TestExecRightAfterServerKilled checks that an exec sent while a killed
// server is still dying is served by the next server: the stub keeps each
// connection until a server acknowledges it. Without that, a connection
// handed to the dying server was reset within a few rounds.
func TestExecRightAfterServerKilled(t *testing.T) {
	b := newBackend(t)
	s := newSandbox(t, b, nil)
	for i := range 100 {
		if r := sh(t, s, "kill -9 -1; echo ok"); r.stdout != "ok\n" {
			t.Fatalf("round %d: kill -9 -1: %q", i, r.stdout)
		}
		if r := sh(t, s, "echo again"); r.stdout != "again\n" {
			t.Fatalf("round %d: exec after kill -9 -1: %q", i, r.stdout)
		}
	}
}

// TestGatedExec checks the stub's gate, which runs before libc starts:
// the command gets its argv and environment through it, and a file the
// kernel refuses to execute comes back as the exec's error, after which
// the sandbox still serves.
func TestGatedExec(t *testing.T) {
	b := newBackend(t)
	s := newSandbox(t, b, nil)
	r := run1(t, s, backend.ExecSpec{Argv: []string{"sh", "-c", `echo "$0 $1 $GATED"`, "a b", "c"},
		Env: []string{"PATH=/bin", "GATED=yes"}})
	if r.stdout != "a b c yes\n" {
		t.Fatalf("argv and env through the gate: %q", r.stdout)
	}
	sh(t, s, `printf '\001\002\003\004' > /tmp/junk; chmod 755 /tmp/junk`)
	_, err := tryRun(context.Background(), s, backend.ExecSpec{Argv: []string{"/tmp/junk"}})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "exec format error") {
		t.Fatalf("exec of a file that is no program: %v, want invalid argument (exec format error)", err)
	}
	if r := sh(t, s, "echo still"); r.stdout != "still\n" {
		t.Fatalf("exec after a failed one: %q", r.stdout)
	}
}
