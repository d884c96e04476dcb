// Package backendtest is the conformance suite of backend.Backend: one set
// of behaviours (exec, streaming, stdin, timeouts, output caps, files and
// path traversal, memory limits, pause/resume, error kinds, cleanup,
// restart recovery) that every backend must show, run by each backend's
// own tests through Run with a Harness that builds it. A behaviour a
// backend does not offer is skipped only when the backend says so with an
// errdefs.NotSupported error, which the suite checks; nothing passes by
// being left out. docs/ARCHITECTURE.md says how to plug a new backend in.
//
// It imports backend and errdefs only (tests of a backend import it, never
// production code).
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
	h Harness
	b backend.Backend
	s backend.Sandbox
}

// Run runs every conformance subtest against the harness's backend. They
// share one sandbox and run in order (Resettable and Stop make their own);
// RestartRecovery comes last because it removes the shared one.
func Run(t *testing.T, h Harness) {
	st := &suite{h: h, b: h.New(t)}
	t.Run("CreateErrors", st.createErrors)
	spec := h.Spec(t)
	st.s = st.create(t, spec)
	for _, sub := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"Exec", st.exec},
		{"ExecEnvCwdUser", st.execEnvCwdUser},
		{"ExecErrors", st.execErrors},
		{"Stdin", st.stdin},
		{"Streaming", st.streaming},
		{"Background", st.background},
		{"Timeout", st.timeoutKills},
		{"OutputLimit", st.outputLimit},
		{"OutputCallbackError", st.outputCallbackError},
		{"Files", st.files},
		{"FilesTraversal", st.filesTraversal},
		{"FileErrors", st.fileErrors},
		{"MemoryLimit", st.memoryLimit},
		{"PauseResume", st.pauseResume},
		{"PausedStandsStill", st.pausedStandsStill},
		{"DuplicateID", st.duplicateID},
		{"Resettable", st.resettable},
		{"Stop", st.stop},
		{"RestartRecovery", st.restartRecovery},
	} {
		t.Run(sub.name, sub.fn)
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
	var mu sync.Mutex
	var out, errb bytes.Buffer
	res, err := s.Exec(ctx, spec, func(st backend.Stream, p []byte) error {
		mu.Lock()
		defer mu.Unlock()
		if st == backend.Stdout {
			out.Write(p)
		} else {
			errb.Write(p)
		}
		return nil
	})
	return Result{res, out.String(), errb.String()}, err
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

const sigKILL, sigTERM, sigPIPE = 9, 15, 13

func (st *suite) createErrors(t *testing.T) {
	for _, id := range []string{"", "a/b", "..", strings.Repeat("x", backend.MaxIDLen+1)} {
		spec := st.h.Spec(t)
		spec.ID = id
		if s, err := st.b.Create(st.ctx(t), spec); !errdefs.IsInvalidArgument(err) {
			if err == nil {
				st.cleanup(t, id, s.Record())
			}
			t.Errorf("create with id %q: %v; want invalid argument", id, err)
		}
	}
	if _, err := st.b.Recover(st.ctx(t), "never-made", nil); !errdefs.IsNotFound(err) {
		t.Errorf("recover of an unknown id: %v; want not found", err)
	}
	if err := st.b.Cleanup(st.ctx(t), "never-made", nil); err != nil {
		t.Errorf("cleanup of an unknown id: %v; want nil (idempotent)", err)
	}
}

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

func (st *suite) readFile(t *testing.T, path string, off, limit int64) string {
	t.Helper()
	rc, err := st.s.ReadFile(st.ctx(t), path, off, limit)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

func (st *suite) files(t *testing.T) {
	ctx := st.ctx(t)
	s := st.s
	data := bytes.Repeat([]byte("corral "), 30000) // several frames of any transport
	if n, err := s.WriteFile(ctx, "/work/a/b.txt", bytes.NewReader(data), backend.WriteOptions{Mode: 0o640, MakeParents: true}); err != nil || n != int64(len(data)) {
		t.Fatalf("write: %d, %v", n, err)
	}
	if got := strings.Fields(st.sh(t, "wc -c < /work/a/b.txt; stat -c %a /work/a/b.txt")); len(got) != 2 || got[0] != "210000" || got[1] != "640" {
		t.Errorf("the sandbox sees %q, want 210000 bytes, mode 640", got)
	}
	if _, err := s.WriteFile(ctx, "/work/a/b.txt", strings.NewReader("END"), backend.WriteOptions{Append: true}); err != nil {
		t.Fatal(err)
	}
	if got := st.readFile(t, "/work/a/b.txt", int64(len(data))-3, 0); got != "al END" {
		t.Errorf("read from an offset after append: %q", got)
	}
	if got := st.readFile(t, "/work/a/b.txt", 7, 6); got != "corral" {
		t.Errorf("read with offset 7, limit 6: %q", got)
	}
	st.sh(t, "echo made-inside > /work/c.txt")
	if got := st.readFile(t, "/work/c.txt", 0, 0); got != "made-inside\n" {
		t.Errorf("a file written inside: %q", got)
	}
	if err := s.MakeDir(ctx, "/work/d/e", 0o750, true); err != nil {
		t.Fatal(err)
	}
	ents, err := s.ListDir(ctx, "/work")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name)
	}
	if strings.Join(names, ",") != "a,c.txt,d" {
		t.Errorf("list /work: %v, want a, c.txt, d (sorted)", names)
	}
	fi, err := s.Stat(ctx, "/work/d/e")
	if err != nil || !fi.Mode.IsDir() || fi.Mode.Perm() != 0o750 || fi.Path != "/work/d/e" || fi.Name != "e" {
		t.Errorf("stat of a new dir: %+v %v", fi, err)
	}
	fi, err = s.Stat(ctx, "/work/c.txt")
	if err != nil || fi.Size != 12 || !fi.Mode.IsRegular() || fi.ModTime.IsZero() {
		t.Errorf("stat of a file: %+v %v", fi, err)
	}
	st.sh(t, "ln -s c.txt /work/link")
	if fi, err := s.Stat(ctx, "/work/link"); err != nil || fi.LinkTarget != "c.txt" {
		t.Errorf("stat of a symlink: %+v %v; want LinkTarget c.txt", fi, err)
	}
	if err := s.Remove(ctx, "/work/d", false); err == nil {
		t.Error("non-recursive remove of a non-empty dir succeeded")
	}
	if err := s.Remove(ctx, "/work", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(ctx, "/work"); !errdefs.IsNotFound(err) {
		t.Errorf("/work after remove: %v; want not found", err)
	}
}

// filesTraversal: ".." and symlinks resolve inside the sandbox's root,
// never on the host.
func (st *suite) filesTraversal(t *testing.T) {
	ctx := st.ctx(t)
	s := st.s
	st.sh(t, "mkdir -p /tt && echo inside > /tt/in && ln -sfn / /tt/root && ln -sfn ../../../../.. /tt/up && ln -sfn /etc/passwd /tt/pw")
	defer st.sh(t, "rm -rf /tt")
	if fi, err := s.Stat(ctx, "/tt/root/tt/in"); err != nil || fi.Size != 7 {
		t.Errorf("stat through a symlink to /: %+v %v", fi, err)
	}
	if got := st.readFile(t, "/../../../../tt/in", 0, 0); got != "inside\n" {
		t.Errorf("read with .. above the root: %q", got)
	}
	if got := st.readFile(t, "/tt/up/tt/in", 0, 0); got != "inside\n" {
		t.Errorf("read through a symlink climbing above the root: %q", got)
	}
	// The host's /etc/passwd differs from the image's; what comes back
	// must be the sandbox's.
	inside := st.sh(t, "cat /etc/passwd")
	if got := st.readFile(t, "/tt/pw", 0, 0); got != inside {
		t.Errorf("absolute symlink resolved outside the sandbox: %q", got)
	}
	if got := st.readFile(t, "/tt/up/etc/passwd", 0, 0); got != inside {
		t.Errorf("relative symlink resolved outside the sandbox: %q", got)
	}
	if _, err := s.WriteFile(ctx, "/tt/up/tt/written", strings.NewReader("x"), backend.WriteOptions{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if got := st.sh(t, "cat /tt/written"); got != "x" {
		t.Errorf("write through a climbing symlink landed elsewhere: %q", got)
	}
	if _, err := s.Stat(ctx, "relative/path"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("relative path: %v; want invalid argument", err)
	}
}

func (st *suite) fileErrors(t *testing.T) {
	ctx := st.ctx(t)
	s := st.s
	if _, err := s.ReadFile(ctx, "/no/such/file", 0, 0); !errdefs.IsNotFound(err) {
		t.Errorf("read missing: %v; want not found", err)
	}
	if _, err := s.Stat(ctx, "/no-such-file"); !errdefs.IsNotFound(err) {
		t.Errorf("stat missing: %v; want not found", err)
	}
	if _, err := s.ListDir(ctx, "/no-such-dir"); !errdefs.IsNotFound(err) {
		t.Errorf("list missing: %v; want not found", err)
	}
	if _, err := s.WriteFile(ctx, "/no/parent/f", strings.NewReader("x"), backend.WriteOptions{Mode: 0o644}); !errdefs.IsNotFound(err) {
		t.Errorf("write without parents: %v; want not found", err)
	}
	if err := s.MakeDir(ctx, "/tmp", 0o755, false); !errdefs.IsAlreadyExists(err) {
		t.Errorf("mkdir of an existing dir: %v; want already exists", err)
	}
	if err := s.Remove(ctx, "/no-such-file", false); !errdefs.IsNotFound(err) {
		t.Errorf("remove missing: %v; want not found", err)
	}
}

// memoryLimit: a command that outgrows the sandbox's memory is killed
// and flagged, and the sandbox keeps serving.
func (st *suite) memoryLimit(t *testing.T) {
	r, err := st.tryRun(st.ctx(t), backend.ExecSpec{Argv: []string{"awk", "BEGIN { s = \"xxxxxxxxxxxxxxxx\"; while (1) s = s s }"}})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OOMKilled || r.Signal != sigKILL {
		t.Errorf("memory bomb: %+v; want OOMKilled and SIGKILL", r.ExecResult)
	}
	if got := st.sh(t, "echo still-here"); got != "still-here\n" {
		t.Errorf("after OOM: %q", got)
	}
}

// startCounter starts a loop that bumps /tmp/c (by rename, so a read
// never sees it half written) and returns its pid once it has counted.
func (st *suite) startCounter(t *testing.T) string {
	t.Helper()
	return strings.TrimSpace(st.sh(t, "(i=0; while true; do i=$((i+1)); echo $i > /tmp/c.n; mv /tmp/c.n /tmp/c; sleep 0.05; done) >/dev/null 2>&1 & echo $!; while [ ! -s /tmp/c ]; do sleep 0.05; done"))
}

func (st *suite) waitCounterPast(t *testing.T, v string) {
	t.Helper()
	deadline := time.Now().Add(st.h.timeout())
	for st.readFile(t, "/tmp/c", 0, 0) == v {
		if time.Now().After(deadline) {
			t.Fatal("counter does not advance after resume")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pauseResume: pause and resume are idempotent, and a process started
// before the pause goes on after the resume with its files.
func (st *suite) pauseResume(t *testing.T) {
	ctx := st.ctx(t)
	pid := st.startCounter(t)
	defer st.sh(t, "kill "+pid)
	v := st.readFile(t, "/tmp/c", 0, 0)
	for i := 0; i < 2; i++ {
		if err := st.s.Pause(ctx); err != nil {
			t.Fatalf("pause %d: %v", i+1, err)
		}
	}
	for i := 0; i < 2; i++ {
		if err := st.s.Resume(ctx); err != nil {
			t.Fatalf("resume %d: %v", i+1, err)
		}
	}
	st.waitCounterPast(t, v)
	if got := st.sh(t, "echo ok"); got != "ok\n" {
		t.Errorf("exec after resume: %q", got)
	}
}

// pausedStandsStill: while paused the counter does not move, however
// long we wait (read through the file calls, which such a backend serves
// from outside the frozen processes).
func (st *suite) pausedStandsStill(t *testing.T) {
	if st.h.NoCallsWhilePaused != "" {
		t.Skip(st.h.NoCallsWhilePaused)
	}
	ctx := st.ctx(t)
	pid := st.startCounter(t)
	defer st.sh(t, "kill "+pid)
	if err := st.s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	v1 := st.readFile(t, "/tmp/c", 0, 0)
	time.Sleep(500 * time.Millisecond)
	v2 := st.readFile(t, "/tmp/c", 0, 0)
	if err := st.s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if v1 != v2 {
		t.Errorf("counter advanced while paused: %s -> %s", v1, v2)
	}
	st.waitCounterPast(t, v2)
}

// duplicateID: a second create with a live sandbox's ID fails as
// already existing and leaves the live one alone.
func (st *suite) duplicateID(t *testing.T) {
	spec := st.h.Spec(t)
	spec.ID = st.s.ID()
	if _, err := st.b.Create(st.ctx(t), spec); !errdefs.IsAlreadyExists(err) {
		t.Errorf("create with a live sandbox's id: %v; want already exists", err)
	}
	if got := st.sh(t, "echo unharmed"); got != "unharmed\n" {
		t.Errorf("the live sandbox after a duplicate create: %q", got)
	}
}

// resettable: a Spec.Resettable sandbox implements Resetter, and a reset
// forgets what a command wrote; a backend without fncall pools refuses
// the spec as not supported.
func (st *suite) resettable(t *testing.T) {
	spec := st.h.Spec(t)
	spec.Resettable = true
	spec.Resources.DiskBytes = 16 << 20
	s, err := st.b.Create(st.ctx(t), spec)
	if errdefs.IsNotSupported(err) {
		t.Skipf("backend refuses resettable sandboxes: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.cleanup(t, spec.ID, s.Record()) })
	rs, ok := s.(backend.Resetter)
	if !ok {
		t.Fatalf("a resettable sandbox (%T) does not implement backend.Resetter", s)
	}
	if _, err := s.WriteFile(st.ctx(t), "/tmp/call1", strings.NewReader("x"), backend.WriteOptions{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.Reset(st.ctx(t), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(st.ctx(t), "/tmp/call1"); !errdefs.IsNotFound(err) {
		t.Errorf("a file of the call before the reset: %v; want not found", err)
	}
}

// stop: Stop ends every process of a sandbox (Done closes), later calls
// fail as a failed precondition, a second Stop is a no-op, and Cleanup
// then leaves nothing.
func (st *suite) stop(t *testing.T) {
	spec := st.h.Spec(t)
	s, err := st.b.Create(st.ctx(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.cleanup(t, spec.ID, s.Record()) })
	if _, err := s.Exec(st.ctx(t), backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "sleep 1000 >/dev/null 2>&1 &"},
		Env: []string{"PATH=/bin:/usr/bin"}, Cwd: "/", OutputLimit: 1 << 10}, func(backend.Stream, []byte) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := s.Stop(st.ctx(t)); err != nil {
			t.Fatalf("stop %d: %v", i+1, err)
		}
	}
	select {
	case <-s.Done():
	case <-time.After(st.h.timeout()):
		t.Fatal("Done not closed after Stop")
	}
	_, err = s.Exec(st.ctx(t), backend.ExecSpec{Argv: []string{"true"}, Env: []string{"PATH=/bin"}, Cwd: "/"},
		func(backend.Stream, []byte) error { return nil })
	if !errdefs.IsFailedPrecondition(err) {
		t.Errorf("exec after Stop: %v; want failed precondition", err)
	}
	if _, err := s.Stat(st.ctx(t), "/"); err == nil {
		t.Error("stat after Stop succeeded")
	}
}

// restartRecovery: a new backend over the same host state (a restarted
// daemon) re-attaches to the shared sandbox with its files and processes;
// Sweep then removes it (no record kept) and leaves nothing behind;
// Cleanup afterwards and Recover of the removed sandbox behave.
func (st *suite) restartRecovery(t *testing.T) {
	ctx := st.ctx(t)
	old := st.s
	id, rec := old.ID(), old.Record()
	pid := strings.TrimSpace(st.sh(t, "echo kept > /root/mark; sleep 1000 >/dev/null 2>&1 & echo $!"))
	if st.h.Detach != nil {
		st.h.Detach(old)
	}
	b2 := st.h.New(t)
	s2, err := b2.Recover(ctx, id, rec)
	if err != nil {
		t.Fatalf("recover: %v", err)
	}
	st.s = s2
	if got := st.sh(t, "cat /root/mark; kill -0 "+pid+" && echo running"); got != "kept\nrunning\n" {
		t.Errorf("recovered sandbox: %q; want its file and its background process", got)
	}
	if err := b2.Sweep(ctx, func(other string) bool { return other != id }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s2.Done():
	case <-time.After(st.h.timeout()):
		t.Error("Done not closed after Sweep removed the sandbox")
	}
	st.assertGone(t, id)
	if err := b2.Cleanup(ctx, id, rec); err != nil {
		t.Errorf("cleanup after sweep: %v", err)
	}
	if err := b2.Cleanup(ctx, id, nil); err != nil {
		t.Errorf("cleanup without a record: %v", err)
	}
	if _, err := b2.Recover(ctx, id, rec); !errdefs.IsNotFound(err) {
		t.Errorf("recover after cleanup: %v; want not found", err)
	}
	st.assertGone(t, id)
}
