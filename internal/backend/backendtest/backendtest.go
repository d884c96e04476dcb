// Package backendtest is the conformance suite of backend.Backend: one set
// of behaviours (exec, streaming, stdin, timeouts, output caps, files and
// path traversal, tree copy, terminals, memory, CPU, pids and disk limits,
// pause/resume, error kinds, cleanup, restart recovery) that every backend
// must show, run by each backend's own tests through Run with a Harness
// that builds it. A behaviour a backend does not offer is skipped only
// when the backend says so with an errdefs.NotSupported error (for a
// limit, through backend.LimitEnforcer), which the suite checks; nothing
// passes by being left out. docs/ARCHITECTURE.md says how to plug a new backend in.
//
// It imports backend and errdefs only (tests of a backend import it, never
// production code).
package backendtest

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

// Harness builds the backend under test.
type Harness struct {
	// New returns a backend. Every call returns one over the same host
	// state (run dir, writable layers, cgroup parent): a second call stands
	// for the daemon after a restart.
	New func(t *testing.T) backend.Backend
	// Spec returns a default sandbox's spec with a fresh, unique ID. The
	// image holds busybox (sh, cat, id, ps, sleep, yes, dd … on /bin) and a
	// user nobody (65534:65534) in /etc/passwd.
	Spec func(t *testing.T) backend.Spec
	// Detach, when set, drops what the old daemon's process held and a
	// restart would close (a guest agent's single connection), so that a
	// new backend can Recover the sandbox.
	Detach func(s backend.Sandbox)
	// Leftovers lists what of sandbox id is still on the host (processes,
	// mounts, cgroups, files); the suite calls it after Cleanup and Sweep
	// and fails on every entry.
	Leftovers func(id string) []string
	// NoCallsWhilePaused, when set, says why the backend serves no call
	// on a paused sandbox (the node resumes one before any call): the
	// subtest that reads files while paused skips with it.
	NoCallsWhilePaused string
	// Skip names subtests the backend does not pass, each with the
	// reason (a known difference its docs state, e.g. a guest agent that
	// returns output only once the command's pipes close): the subtest
	// skips with it. A name that is no subtest fails the run.
	Skip map[string]string
	// Timeout bounds one create or one command (default 30 s); emulated
	// guests need minutes.
	Timeout time.Duration
}

func (h Harness) timeout() time.Duration {
	if h.Timeout > 0 {
		return h.Timeout
	}
	return 30 * time.Second
}

// suite is one run: the harness, the backend and the sandbox most
// subtests share (a microVM boot costs seconds to minutes under TCG; the
// subtests leave it running and clean).
type suite struct {
	h    Harness
	b    backend.Backend
	s    backend.Sandbox
	spec backend.Spec // the shared sandbox's
	// lim is the sandbox the limit subtests share (nil until the first
	// of them makes it, and again once they are done).
	lim *limitedSandbox
}

// Run runs every conformance subtest against the harness's backend. They
// share one sandbox and run in order (Resettable and Stop make their own);
// RestartRecovery comes last because it removes the shared one.
func Run(t *testing.T, h Harness) {
	st := &suite{h: h, b: h.New(t)}
	skip := maps.Clone(h.Skip)
	t.Run("CreateErrors", st.createErrors)
	st.spec = h.Spec(t)
	st.s = st.create(t, st.spec)
	for _, sub := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"Exec", st.exec},
		{"Clock", st.clock},
		{"ExecEnvCwdUser", st.execEnvCwdUser},
		{"ExecErrors", st.execErrors},
		{"Stdin", st.stdin},
		{"Streaming", st.streaming},
		{"Background", st.background},
		{"Terminal", st.terminal},
		{"Timeout", st.timeoutKills},
		{"OutputLimit", st.outputLimit},
		{"OutputCallbackError", st.outputCallbackError},
		{"Files", st.files},
		{"FilesTraversal", st.filesTraversal},
		{"FileErrors", st.fileErrors},
		{"Trees", st.trees},
		{"MemoryLimit", st.memoryLimit},
		{"CPULimit", st.cpuLimit},
		{"PidsLimit", st.pidsLimit},
		{"DiskLimit", st.diskLimit},
		{"", st.dropLimited}, // not a subtest: frees the limit subtests' sandbox
		{"PauseResume", st.pauseResume},
		{"PausedStandsStill", st.pausedStandsStill},
		{"SnapshotRestore", st.snapshotRestore},
		{"DuplicateID", st.duplicateID},
		{"Resettable", st.resettable},
		{"Stop", st.stop},
		{"RestartRecovery", st.restartRecovery},
	} {
		if sub.name == "" {
			sub.fn(t)
			continue
		}
		if why, ok := skip[sub.name]; ok {
			delete(skip, sub.name)
			t.Run(sub.name, func(t *testing.T) { t.Skip(why) })
			continue
		}
		t.Run(sub.name, sub.fn)
	}
	for name := range skip {
		t.Errorf("Harness.Skip names %q, which is no subtest", name)
	}
}

func (st *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), st.h.timeout())
	t.Cleanup(cancel)
	return ctx
}

// create makes a sandbox that is removed at the end of the test.
func (st *suite) create(t *testing.T, spec backend.Spec) backend.Sandbox {
	t.Helper()
	s, err := st.b.Create(st.ctx(t), spec)
	if err != nil {
		t.Fatalf("create %s: %v", spec.ID, err)
	}
	t.Cleanup(func() { st.cleanup(t, spec.ID, s.Record()) })
	return s
}

// cleanup removes a sandbox and checks that nothing of it remains.
func (st *suite) cleanup(t *testing.T, id string, record []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), st.h.timeout())
	defer cancel()
	if err := st.b.Cleanup(ctx, id, record); err != nil {
		t.Errorf("cleanup %s: %v", id, err)
	}
	st.assertGone(t, id)
}

func (st *suite) assertGone(t *testing.T, id string) {
	t.Helper()
	if st.h.Leftovers == nil {
		return
	}
	for _, l := range st.h.Leftovers(id) {
		t.Errorf("sandbox %s: left on the host: %s", id, l)
	}
}

// Result is one command's end and output.
type Result struct {
	backend.ExecResult
	Stdout, Stderr string
}

// Exec runs spec on s and collects its output, filling in what the node
// would: PATH and HOME, cwd "/" and a 1 MiB output cap. Backend tests use
// it too.
func Exec(ctx context.Context, s backend.Sandbox, spec backend.ExecSpec) (Result, error) {
	if spec.Env == nil {
		spec.Env = []string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin", "HOME=/root"}
	}
	if spec.Cwd == "" {
		spec.Cwd = "/"
	}
	if spec.OutputLimit == 0 {
		spec.OutputLimit = 1 << 20
	}
	var out backend.OutputBuffers
	res, err := s.Exec(ctx, spec, out.Write)
	return Result{res, out.Stdout.String(), out.Stderr.String()}, err
}

// result is one command's end and output.
type result struct {
	backend.ExecResult
	stdout, stderr string
}

func (st *suite) tryRun(ctx context.Context, spec backend.ExecSpec) (result, error) {
	r, err := Exec(ctx, st.s, spec)
	return result{r.ExecResult, r.Stdout, r.Stderr}, err
}

func (st *suite) run(t *testing.T, spec backend.ExecSpec) result {
	t.Helper()
	r, err := st.tryRun(st.ctx(t), spec)
	if err != nil {
		t.Fatalf("exec %q: %v", spec.Argv, err)
	}
	return r
}

// sh runs a script with the image's shell and fails the test unless it
// exits 0.
func (st *suite) sh(t *testing.T, script string) string {
	t.Helper()
	r := st.run(t, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", script}})
	if r.ExitCode != 0 {
		t.Fatalf("%q: exit %d signal %d, stderr %q", script, r.ExitCode, r.Signal, r.stderr)
	}
	return r.stdout
}

// FirstThen is a Harness.New that returns first on its first call and a
// new backend from again on every later one (the restarted daemon), for
// backends whose first construction the test also needs beforehand.
func FirstThen[B backend.Backend](first B, again func() (B, error)) func(t *testing.T) backend.Backend {
	used := false
	return func(t *testing.T) backend.Backend {
		if !used {
			used = true
			return first
		}
		b, err := again()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}
