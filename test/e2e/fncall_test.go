package e2e

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// onePool makes every fncall pool hold exactly one sandbox, so consecutive
// calls of one key run on the same sandbox.
func onePool(c *server.Config) { c.FnCallPoolFloor, c.FnCallPoolCeiling = 1, 1 }

func call(t *testing.T, c *client.Client, o client.CallOptions) *client.CallResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := c.Call(ctx, o)
	if err != nil {
		t.Fatalf("call %q: %v", o.Source, err)
	}
	return r
}

func shCall(src string) client.CallOptions { return client.CallOptions{Language: "sh", Source: src} }

func TestFnCallVerdicts(t *testing.T) {
	srv := testenv.StartServer(t)
	c := srv.Client
	cases := []struct {
		name string
		opts client.CallOptions
		want client.Verdict
	}{
		{"ok", shCall("echo hi"), client.VerdictOK},
		{"exit 3", shCall("exit 3"), client.VerdictRuntimeError},
		{"signal", shCall("kill -SEGV $$"), client.VerdictRuntimeError},
		{"loop (wall)", client.CallOptions{Language: "sh", Source: "while :; do :; done", WallTimeout: 500 * time.Millisecond}, client.VerdictTimeLimit},
		{"loop (cpu)", client.CallOptions{Language: "sh", Source: "while :; do :; done", CPUTimeout: time.Second, WallTimeout: 20 * time.Second}, client.VerdictTimeLimit},
		{"sleep (wall)", client.CallOptions{Language: "sh", Source: "sleep 30", WallTimeout: 300 * time.Millisecond}, client.VerdictTimeLimit},
		{"allocation", client.CallOptions{Language: "sh", Source: "head -c 200m /dev/zero | tail -c 1 >/dev/null; x=$(head -c 100m /dev/zero | tr '\\0' a); echo ${#x}", MemoryBytes: 32 << 20}, client.VerdictMemoryLimit},
		{"yes", client.CallOptions{Language: "sh", Source: "yes", OutputLimit: 4096}, client.VerdictOutputLimit},
		{"no binary", client.CallOptions{Args: []string{"no-such-binary"}}, client.VerdictRuntimeError},
	}
	for _, tc := range cases {
		r := call(t, c, tc.opts)
		if r.Verdict != tc.want {
			t.Errorf("%s: verdict %s, want %s (exit %d, signal %d, stderr %q)", tc.name, r.Verdict, tc.want, r.ExitCode, r.Signal, r.Stderr)
		}
		if tc.name == "exit 3" && r.ExitCode != 3 {
			t.Errorf("exit 3: code %d", r.ExitCode)
		}
		if tc.name == "ok" && (string(r.Stdout) != "hi\n" || r.WallTime <= 0 || r.PeakMemory <= 0) {
			t.Errorf("ok: %+v", r)
		}
		if tc.name == "yes" && len(r.Stdout) > 4096 {
			t.Errorf("yes: %d bytes of output past the cap", len(r.Stdout))
		}
	}
}

// initStart prints the start time of the sandbox's init: the same value in
// two calls means the same sandbox.
const initStart = "cut -d' ' -f22 /proc/1/stat"

func TestFnCallIsolationOnOneSandbox(t *testing.T) {
	srv := testenv.StartServer(t, onePool)
	c := srv.Client
	r1 := call(t, c, shCall(initStart+"; echo secret > /tmp/left; echo x > /etc/passwd; export LEAK=1; echo 'export LEAK=1' >> /etc/profile; (sleep 1000 &); sleep 0.1"))
	r2 := call(t, c, shCall(initStart+"; ls /tmp/left 2>&1; cat /etc/passwd | head -1; echo LEAK=$LEAK; ps -o comm | grep -c sleep"))
	id1, _, _ := strings.Cut(string(r1.Stdout), "\n")
	id2, rest, _ := strings.Cut(string(r2.Stdout), "\n")
	if id1 == "" || id1 != id2 {
		t.Fatalf("calls ran on different sandboxes (%q, %q): the test proves nothing", id1, id2)
	}
	if !strings.Contains(rest, "No such file") || !strings.Contains(rest, "root:") ||
		!strings.Contains(rest, "LEAK=\n") || !strings.HasSuffix(rest, "0\n") {
		t.Fatalf("call 2 sees call 1's state:\n%s", rest)
	}
}

// TestFnCallNothingLeftForTheNextCall: a call that writes nothing (a clean
// reset) but leaves processes behind, a detached one, a grandchild whose
// parent exited and a stopped one: the next call on the same sandbox finds
// none of them (the node kills them through the cgroup as the call ends,
// and init's reset kills what is left; the recycling tests, where only
// init's reset does, cover that one alone).
func TestFnCallNothingLeftForTheNextCall(t *testing.T) {
	srv := testenv.StartServer(t, onePool)
	c := srv.Client
	leave := "setsid sleep 1001 </dev/null >/dev/null 2>&1 & " +
		"(sh -c 'sleep 1002 </dev/null >/dev/null 2>&1 &') ; " +
		"sleep 1003 </dev/null >/dev/null 2>&1 & sleep 0.1; kill -STOP $!"
	count := "ps -o comm | grep -c '^sleep$'"
	for i := range 3 {
		r1 := call(t, c, shCall(initStart+"; "+leave+"; "+count))
		r2 := call(t, c, shCall(initStart+"; "+count+"; "+count))
		id1, left1, _ := strings.Cut(string(r1.Stdout), "\n")
		id2, left2, _ := strings.Cut(string(r2.Stdout), "\n")
		if id1 == "" || id1 != id2 {
			t.Fatalf("calls ran on different sandboxes (%q, %q): the test proves nothing", id1, id2)
		}
		if strings.TrimSpace(left1) != "3" {
			t.Fatalf("round %d: the first call left %q sleeps running, want 3 (stderr %q)", i, left1, r1.Stderr)
		}
		if strings.TrimSpace(left2) != "0\n0" {
			t.Fatalf("round %d: the next call on the same sandbox sees sleeps of the last: %q", i, left2)
		}
	}
}

func TestFnCallFilesAndBatch(t *testing.T) {
	srv := testenv.StartServer(t)
	c := srv.Client
	r := call(t, c, client.CallOptions{Language: "sh", Source: "cat in.txt | tr a-z A-Z > out.txt; cat -",
		Stdin: []byte("stdin\n"), Files: map[string][]byte{"in.txt": []byte("hello")}, OutputFiles: []string{"out.txt", "/missing"}})
	if r.Verdict != client.VerdictOK || string(r.Files["out.txt"]) != "HELLO" || string(r.Stdout) != "stdin\n" {
		t.Fatalf("files: %+v", r)
	}
	if _, ok := r.Files["/missing"]; ok {
		t.Fatalf("missing output file returned")
	}
	var calls []client.CallOptions
	for i := range 20 {
		calls = append(calls, shCall(strings.Repeat("echo x;", i%3)+"exit "+string(rune('0'+i%5))))
	}
	res, err := c.CallBatch(context.Background(), calls)
	if err != nil || len(res) != len(calls) {
		t.Fatalf("batch: %v (%d results)", err, len(res))
	}
	for i, r := range res {
		if r.ExitCode != i%5 || len(r.Stdout) != 2*(i%3) {
			t.Errorf("batch result %d out of order: %+v", i, r)
		}
	}
}

// A hung or crashed call does not poison the pool: the next call on the
// same (single) sandbox works.
func TestFnCallPoolSurvivesBadCalls(t *testing.T) {
	srv := testenv.StartServer(t, onePool)
	c := srv.Client
	call(t, c, client.CallOptions{Language: "sh", Source: "trap '' TERM; (sleep 1000 &); while :; do :; done", WallTimeout: 300 * time.Millisecond})
	call(t, c, shCall(":(){ :|:& };:"))
	call(t, c, client.CallOptions{Language: "sh", Source: "x=$(head -c 100m /dev/zero | tr '\\0' a)", MemoryBytes: 32 << 20})
	call(t, c, shCall("head -c 10m /dev/zero > /tmp/fill; rm -rf /bin/* 2>/dev/null; kill -9 -1"))
	r := call(t, c, shCall("echo alive; ls /tmp"))
	if r.Verdict != client.VerdictOK || string(r.Stdout) != "alive\n" {
		t.Fatalf("pool poisoned: %+v stderr %q", r, r.Stderr)
	}
}

// A pooled sandbox that dies while idle (its init killed from the host) is
// not handed to the next call: that call runs on a new sandbox, and the
// dead one's cgroup goes.
func TestFnCallPooledSandboxDiesIdle(t *testing.T) {
	srv := testenv.StartServer(t, onePool)
	c := srv.Client
	parent := srv.Config.CgroupParent
	first := call(t, c, shCall(initStart))
	// Killed once reset and back in the pool, not during its reset.
	waitFor(t, func() bool { return strings.Contains(metrics(t, srv), `kind="idle",memory_bytes="268435456"} 1`) })
	pids := testenv.SandboxProcesses(parent)
	if len(pids) == 0 {
		t.Fatalf("no process of the pooled sandbox under %s", parent)
	}
	for _, p := range pids {
		pid, _ := strconv.Atoi(p)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	waitFor(t, func() bool { return len(testenv.SandboxProcesses(parent)) == 0 })
	// With an input file: the write is what met the dead sandbox before.
	r := call(t, c, client.CallOptions{Language: "sh", Source: "cat in; " + initStart, Files: map[string][]byte{"in": []byte("in\n")}})
	if r.Verdict != client.VerdictOK || !strings.HasPrefix(string(r.Stdout), "in\n") || strings.TrimPrefix(string(r.Stdout), "in\n") == string(first.Stdout) {
		t.Fatalf("call after the pooled sandbox died: %+v stderr %q (first call's init start %q)", r, r.Stderr, first.Stdout)
	}
	waitFor(t, func() bool { return len(fnCgroups(parent)) == 1 })
}

// fnCgroups lists the fncall sandboxes' cgroups under parent (pids controller).
func fnCgroups(parent string) []string {
	m, _ := filepath.Glob("/sys/fs/cgroup/pids/" + parent + "/fn-*")
	return m
}

func TestFnCallBadInputs(t *testing.T) {
	srv := testenv.StartServer(t)
	c := srv.Client
	cases := []struct {
		name    string
		opts    client.CallOptions
		code    client.Code
		mention string
	}{
		{"unknown language", client.CallOptions{Language: "cobol", Source: "x"}, client.CodeInvalidArgument, "python, sh"},
		{"nothing to run", client.CallOptions{}, client.CodeInvalidArgument, "language"},
		{"argv and source", client.CallOptions{Args: []string{"true"}, Language: "sh", Source: "x"}, client.CodeInvalidArgument, "argv"},
		{"negative wall", client.CallOptions{Language: "sh", Source: "true", WallTimeout: -time.Second}, client.CodeInvalidArgument, "wall_time_limit"},
		{"tiny memory", client.CallOptions{Language: "sh", Source: "true", MemoryBytes: 1}, client.CodeInvalidArgument, "memory_limit_bytes"},
		{"negative output", client.CallOptions{Language: "sh", Source: "true", OutputLimit: -1}, client.CodeInvalidArgument, "output_limit_bytes"},
		{"oversized source", client.CallOptions{Language: "sh", Source: strings.Repeat("x", 2<<20)}, client.CodeInvalidArgument, "source"},
		{"unknown image", client.CallOptions{Language: "sh", Source: "true", Image: "nosuchimage"}, client.CodeNotFound, "nosuchimage"},
	}
	for _, tc := range cases {
		_, err := c.Call(context.Background(), tc.opts)
		if client.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("%s: err = %v, want %s mentioning %q", tc.name, err, tc.code, tc.mention)
		}
	}
	_, err := c.CallBatch(context.Background(), []client.CallOptions{shCall("true"), {Language: "cobol"}})
	if !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "calls[1]") {
		t.Errorf("bad batch: %v", err)
	}
}
