package redteam

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

var (
	table    *Table
	report   = NewReport()
	probeBin string // the static probe, built by TestMain
)

func TestMain(m *testing.M) {
	var err error
	if table, err = LoadTables("testdata/expected.json", "testdata/expected-*.json"); err != nil {
		fmt.Fprintln(os.Stderr, "redteam:", err)
		os.Exit(1)
	}
	if os.Getenv("CORRAL_REDTEAM") == "" {
		// `go test ./...` (scripts/test.sh) would run it a second time. Run
		// only the test that says why, so the run reports a skip, not a pass.
		flag.Parse()
		_ = flag.Set("test.run", "^TestSuiteIsSwitchedOn$")
		os.Exit(m.Run())
	}
	if os.Geteuid() != 0 {
		fmt.Println("redteam: skipped: needs root (creates namespaces, mounts and cgroups, reads other processes' /proc)")
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "corral-probe-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "redteam:", err)
		os.Exit(1)
	}
	probeBin = filepath.Join(dir, "corral-probe")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", probeBin, "github.com/corral-dev/corral/cmd/corral-probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "redteam: build probe: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	fmt.Print("\n=== red-team table (attempt × backend) ===\n" + report.Format(table))
	os.Exit(code)
}

// TestSuiteIsSwitchedOn skips, with the reason, when the suite is off;
// otherwise it checks that TestMain made what the attempts need.
func TestSuiteIsSwitchedOn(t *testing.T) {
	if os.Getenv("CORRAL_REDTEAM") == "" {
		t.Skip("redteam: set CORRAL_REDTEAM=1 or run `make redteam`")
	}
	if table == nil || (os.Geteuid() == 0 && probeBin == "") {
		t.Fatal("TestMain did not load the attempt table or build the probe")
	}
}

// canaries are secrets planted outside every sandbox: the node's log, a
// config file in its data dir and its environment. The probe must find none.
type canaries struct {
	Log, Config, Env string
}

func (c canaries) list() []string { return []string{c.Log, c.Config, c.Env} }

// startServer starts a server whose log, data dir and environment carry
// canaries; the log goes to a file in the data dir (like a harness log).
func startServer(t *testing.T, mutate ...func(*server.Config)) (*testenv.Server, canaries) {
	t.Helper()
	c := canaries{
		Log:    testenv.UniqueName("CANARY-LOG") + testenv.UniqueName(""),
		Config: testenv.UniqueName("CANARY-CONFIG") + testenv.UniqueName(""),
		Env:    testenv.UniqueName("CANARY-ENV") + testenv.UniqueName(""),
	}
	t.Setenv("CORRAL_GRADER_SECRET", c.Env)
	logPath := filepath.Join(t.TempDir(), "node.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logFile.Close() })
	logger := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := testenv.StartServer(t, testenv.WithAgent(t), func(cfg *server.Config) {
		cfg.Logger = logger
		// Before the server starts: its store then turns layers/ into a
		// mount of its own, across which nothing can be hard-linked.
		addDebianImage(t, filepath.Join(cfg.DataDir, "images"))
		for _, m := range mutate {
			m(cfg)
		}
	})
	logger.Info("grader answer", "secret", c.Log)
	// The log also lives in the data dir, where a harness keeps its files.
	if err := os.WriteFile(filepath.Join(srv.Config.DataDir, "harness.log"), []byte("answer="+c.Log+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(srv.Config.DataDir, "config.toml"), []byte("token = \""+c.Config+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return srv, c
}

// addDebianImage links the host's cached Debian image (bash, python3)
// into the server's store when there is one; the suite uses busybox
// otherwise (the probe then plants bash and python3 instead of replacing them).
func addDebianImage(t *testing.T, dst string) {
	cached := "/var/lib/corral/images"
	if d := os.Getenv("CORRAL_REDTEAM_IMAGES"); d != "" { // another store's images dir
		cached = d
	}
	if _, err := os.Stat(filepath.Join(cached, "debian", "image.json")); err != nil {
		return
	}
	// The image's composition and its EROFS layer files, hard-linked.
	layers, _ := filepath.Glob(filepath.Join(cached, "layers", "*.erofs"))
	cmds := [][]string{{"mkdir", "-p", dst}, {"cp", "-al", filepath.Join(cached, "debian"), filepath.Join(dst, "debian")}}
	if len(layers) > 0 {
		cmds = append(cmds, []string{"mkdir", "-p", filepath.Join(dst, "layers")},
			// Symlinks: the cached layers directory is a mount point of its
			// store, across which files cannot be hard-linked.
			append(append([]string{"ln", "-s"}, layers...), filepath.Join(dst, "layers")))
	}
	// Split layers (data blobs beside the metadata) of a newer store.
	if blobs, _ := filepath.Glob(filepath.Join(cached, "blobs", "*.blob")); len(blobs) > 0 {
		cmds = append(cmds, []string{"mkdir", "-p", filepath.Join(dst, "blobs")},
			append(append([]string{"ln", "-s"}, blobs...), filepath.Join(dst, "blobs")))
	}
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Logf("no debian image (%v: %s): using busybox", err, out)
			os.RemoveAll(filepath.Join(dst, "debian"))
			return
		}
	}
}

// image is the richest image the server can start: debian when the copy
// above gave it a usable one, else busybox.
func image(t *testing.T, srv *testenv.Server) string {
	sb, err := srv.Client.Create(context.Background(), client.CreateOptions{Image: "debian"})
	if err != nil {
		t.Logf("no usable debian image (%v): using busybox", err)
		return "busybox"
	}
	_ = sb.Delete(context.Background())
	return "debian"
}

// forEachBackend runs f for every backend of the table that this machine
// has; the others get a note in the report.
func forEachBackend(t *testing.T, f func(t *testing.T, backend string)) {
	for _, b := range table.Backends {
		t.Run(b, func(t *testing.T) {
			testenv.RequireRoot(t)
			if why := backendMissing(t, b); why != "" {
				report.Unavailable(b, why)
				t.Skip(why)
			}
			f(t, b)
		})
	}
}

// skipIfTableSays skips t on backend when the table skips every row named
// prefix* for it (recording those rows as n/a), before any sandbox is made.
func skipIfTableSays(t *testing.T, backend, prefix string) {
	t.Helper()
	var why string
	for _, a := range table.Attempts {
		if strings.HasPrefix(a.Name, prefix) {
			if why = a.For(backend).Skip; why == "" {
				return
			}
		}
	}
	if why == "" {
		return
	}
	for _, a := range table.Attempts {
		if strings.HasPrefix(a.Name, prefix) {
			report.Add(a.Name, backend, Judge(a.For(backend), nil))
		}
	}
	t.Skip(why)
}

// backendMissing asks a throwaway server for a sandbox of the backend.
// fncall sandboxes are not reachable through SandboxService at all: its
// probe rows run in TestProbeFnCall.
func backendMissing(t *testing.T, backend string) string {
	if backend == "fncall" {
		return "fncall: a pooled sandbox is reached only through FnCallService; its probe rows run in TestProbeFnCall"
	}
	srv := testenv.StartServer(t, testenv.WithAgent(t))
	sb, err := srv.Client.Create(context.Background(), client.CreateOptions{Backend: backend})
	if err != nil {
		return fmt.Sprintf("create: %v", err)
	}
	_ = sb.Delete(context.Background())
	return ""
}

// installProbe copies the probe into the sandbox.
func installProbe(t *testing.T, sb *client.Sandbox) {
	t.Helper()
	f, err := os.Open(probeBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := sb.Files().WriteFrom(context.Background(), "/corral-probe/corral-probe", f, 0o755); err != nil {
		t.Fatalf("copy probe: %v", err)
	}
}

// runProbe runs the probe with args and stdin and parses its lines.
func runProbe(t *testing.T, sb *client.Sandbox, stdin []byte, args ...string) []Result {
	t.Helper()
	res := testenv.Run(t, sb, client.Command{Args: append([]string{"/corral-probe/corral-probe"}, args...), Stdin: stdin, Timeout: 5 * time.Minute})
	if len(res.Stderr) > 0 {
		t.Logf("probe %v stderr: %s", args, res.Stderr)
	}
	out := parseProbeOutput(t, res.Stdout)
	if res.ExitCode != 0 && len(args) > 0 && args[0] != "kill" {
		t.Errorf("probe %v exited %d (signal %d)", args, res.ExitCode, res.Signal)
	}
	return out
}

// parseProbeOutput reads the probe's JSON lines.
func parseProbeOutput(t *testing.T, stdout []byte) []Result {
	t.Helper()
	var out []Result
	sc := bufio.NewScanner(bytes.NewReader(stdout))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Errorf("probe line %q: %v", sc.Text(), err)
			continue
		}
		out = append(out, r)
	}
	return out
}

// judge compares results with the table and records the verdicts; only
// the attempts named in results (or in names) are judged. FAILED fails t.
func judge(t *testing.T, backend string, results []Result, names ...string) {
	t.Helper()
	byName := map[string][]Result{}
	order := append([]string{}, names...)
	for _, r := range results {
		if _, ok := byName[r.Name]; !ok && !containsName(order, r.Name) {
			order = append(order, r.Name)
		}
		byName[r.Name] = append(byName[r.Name], r)
	}
	for _, n := range order {
		a, ok := table.Lookup(n)
		var v Verdict
		if !ok {
			v = Verdict{Status: StatusFailed, Why: fmt.Sprintf("not in expected.json: %+v", byName[n])}
		} else {
			v = Judge(a.For(backend), byName[n])
		}
		report.Add(n, backend, v)
		switch v.Status {
		case StatusFailed:
			t.Errorf("%s [%s] FAILED: %s", n, backend, v.Why)
		case StatusGap:
			t.Logf("%s [%s] GAP: %s", n, backend, v.Why)
		}
	}
}

func containsName(names []string, n string) bool {
	for _, x := range names {
		if x == n {
			return true
		}
	}
	return false
}

// check builds a suite-made Result: ok when cond holds.
func check(name string, cond bool, detail string, args ...any) Result {
	r := Result{Name: name, Outcome: "ok", Detail: fmt.Sprintf(detail, args...)}
	if !cond {
		r.Outcome = "violated"
	}
	return r
}

func trim(b []byte) string { return strings.TrimSpace(string(b)) }
