package redteam

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// onePoolServer is a server whose fncall pools hold one sandbox, so that
// consecutive calls of a test run on the same pooled sandbox (an attack
// across calls needs that).
func onePoolServer(t *testing.T) *testenv.Server {
	return testenv.StartServer(t, testenv.WithAgent(t), func(cfg *server.Config) {
		cfg.FnCallPoolFloor, cfg.FnCallPoolCeiling = 1, 1
		addDebianImage(t, filepath.Join(cfg.DataDir, "images"))
	})
}

// probeCall runs the probe with args as one call on the sh image.
func probeCall(t *testing.T, srv *testenv.Server, args ...string) *client.CallResult {
	t.Helper()
	bin, err := os.ReadFile(probeBin)
	if err != nil {
		t.Fatal(err)
	}
	r, err := srv.Client.Call(context.Background(), client.CallOptions{
		Args:        []string{"/bin/sh", "-c", "chmod 755 /tmp/corral-probe && exec /tmp/corral-probe " + strings.Join(args, " ")},
		Files:       map[string][]byte{"/tmp/corral-probe": bin},
		WallTimeout: time.Minute,
	})
	if err != nil {
		t.Fatalf("call %v: %v", args, err)
	}
	return r
}

// TestFnCallNoLeaksBetweenCalls (issue 21, finding 4): what one call
// leaves in the kernel must not reach the next call on the same pooled
// sandbox: a POSIX message queue, and the PID counter (how many processes
// the earlier call forked).
func TestFnCallNoLeaksBetweenCalls(t *testing.T) {
	testenv.RequireRoot(t)
	srv := onePoolServer(t)
	name := testenv.UniqueName("leak")
	put := parseProbeOutput(t, probeCall(t, srv, "mq", "put", name).Stdout)
	judge(t, "fncall", put)
	judge(t, "fncall", parseProbeOutput(t, probeCall(t, srv, "mq", "get", name).Stdout))

	before := strings.TrimSpace(string(probeCall(t, srv, "pid").Stdout))
	probeCall(t, srv, "forkn", "100")
	after := strings.TrimSpace(string(probeCall(t, srv, "pid").Stdout))
	sameBox := len(strings.Fields(before)) == 2 && len(strings.Fields(after)) == 2 && strings.Fields(before)[1] == strings.Fields(after)[1]
	judge(t, "fncall", []Result{check("fncall2/pid-counter", sameBox && before == after,
		"pid and sandbox before %q, after a call forked 100: %q (want equal, on one sandbox)", before, after)})
}

// TestFnCallWarmPythonPristine (issue 21, finding 4): a python call
// renices, sets SCHED_IDLE on, pins and raises the OOM score of the warm
// python that forked it, and clones children with CLONE_PARENT (one exits
// at once, one is still running at the reset): the next call must run with
// the stock scheduling state, and on the same pooled sandbox (the zombies
// reaped, the sandbox not destroyed).
func TestFnCallWarmPythonPristine(t *testing.T) {
	testenv.RequireRoot(t)
	srv := onePoolServer(t)
	if image(t, srv) != "debian" {
		rows := []string{"fncall2/warm-nice", "fncall2/warm-sched-policy", "fncall2/warm-affinity", "fncall2/warm-oom-score", "fncall2/clone-parent-zombie"}
		for _, n := range rows {
			report.Add(n, "fncall", Verdict{Status: StatusSkipped, Why: "needs the debian image (python3)"})
		}
		t.Skip("no debian image with python3: set CORRAL_REDTEAM_IMAGES to a store's images dir holding one (corral image build debian)")
	}
	py := func(src string) *client.CallResult {
		r, err := srv.Client.Call(context.Background(), client.CallOptions{Image: "debian", Language: "python", Source: src, WallTimeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("python call: %v", err)
		}
		if r.Verdict != client.VerdictOK {
			t.Fatalf("python call %q: verdict %s: %s", src, r.Verdict, r.Stderr)
		}
		return r
	}
	const ident = "import os\nprint(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19])\n"
	const state = ident + "print(os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), len(os.sched_getaffinity(0)), open('/proc/self/oom_score_adj').read().strip())\n"
	first := strings.Fields(string(py(state).Stdout))
	py(ident + `
pp = os.getppid()
os.setpriority(os.PRIO_PROCESS, pp, 19)
os.sched_setscheduler(pp, os.SCHED_IDLE, os.sched_param(0))
os.sched_setaffinity(pp, {0})
open('/proc/%d/oom_score_adj' % pp, 'w').write('1000')
`)
	second := strings.Fields(string(py(state).Stdout))
	py(ident + `
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for sleep in (0, 100):  # clone(CLONE_PARENT | SIGCHLD): a sibling, child of the warm python
    if libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0) == 0:
        import time; time.sleep(sleep); os._exit(0)
`)
	third := strings.Fields(string(py(state).Stdout))
	if len(first) != 5 || len(second) != 5 || len(third) != 5 {
		t.Fatalf("state lines %q, %q, %q", first, second, third)
	}
	ncpu := runtime.NumCPU()
	judge(t, "fncall", []Result{
		check("fncall2/warm-nice", second[1] == "0", "nice %s (first call %s)", second[1], first[1]),
		check("fncall2/warm-sched-policy", second[2] == "0", "policy %s (0: SCHED_OTHER)", second[2]),
		check("fncall2/warm-affinity", second[3] == first[3], "%s CPUs, first call %s (node %d)", second[3], first[3], ncpu),
		check("fncall2/warm-oom-score", second[4] == first[4], "oom_score_adj %s, first call %s", second[4], first[4]),
		check("fncall2/clone-parent-zombie", third[0] == first[0], "sandbox identity (init start) %s, first call %s: want the same pooled sandbox", third[0], first[0]),
	})
}
