// Package fidelity checks that ordinary software behaves in a default
// sandbox as on an ordinary Linux machine. It runs test suites written by
// others — Go's own os, os/exec, os/signal, io/fs, syscall and
// path/filepath tests, compiled on the host — once on the host and once
// inside a default (busybox) container sandbox, and requires the same
// result for every test; the few known differences are listed in
// knownDifferences, each with its reason. It also checks what those
// suites do not: readdir's inode numbers against stat's over the image's
// layers, real mtimes on image files, and no file size limit. It imports
// only the Go SDK and internal/testenv.
package fidelity

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

// suites are the standard-library packages whose tests run on both sides.
var suites = []string{"os", "os/exec", "os/signal", "io/fs", "syscall", "path/filepath"}

// knownDifferences are tests whose result inside a sandbox differs from the
// host's for a reason that is part of the containment, keyed
// "package.TestName" (a subtest's name includes its parent's).
var knownDifferences = map[string]string{
	"os_exec.TestFindExecutableVsNoexec":          "mounts a tmpfs: mount(2) is refused in a sandbox (seccomp, as Docker's default profile)",
	"os_signal.TestDetectNohup":                   "needs a nohup program: the busybox image's busybox has no nohup applet",
	"os_signal.TestNohup/nohup":                   "needs a nohup program (as above)",
	"syscall.TestAmbientCaps":                     "raises CAP_SYS_TIME and CAP_SYSLOG as ambient capabilities: neither is in a sandbox's capability set",
	"syscall.TestAmbientCapsUserns":               "a new user namespace: CLONE_NEWUSER is refused in a sandbox (seccomp)",
	"syscall.TestCloneNEWUSERAndRemap":            "CLONE_NEWUSER is refused in a sandbox",
	"syscall.TestCloneTimeNamespace":              "CLONE_NEWTIME needs clone3, which answers ENOSYS in a sandbox (its flags are in memory, out of seccomp's reach)",
	"syscall.TestEmptyCredGroupsDisableSetgroups": "CLONE_NEWUSER is refused in a sandbox",
	"syscall.TestGroupCleanupUserNamespace":       "CLONE_NEWUSER is refused in a sandbox",
	"syscall.TestPidFDClone3":                     "clone3 answers ENOSYS in a sandbox (its flags are in memory, out of seccomp's reach)",
	"syscall.TestPidFDWithUserNS":                 "CLONE_NEWUSER is refused in a sandbox",
	"syscall.TestUnshare":                         "needs a network interface besides lo: a sandbox without a network policy has only loopback",
	"syscall.TestUnshareMountNameSpace":           "CLONE_NEWNS is refused in a sandbox (a new mount namespace could unmount masks)",
}

// knownDifference returns the reason listed for test name of pkg or for
// one of its parents (a listed test covers its subtests).
func knownDifference(pkg, name string) (string, bool) {
	for n := name; ; {
		if why, ok := knownDifferences[pkg+"."+n]; ok {
			return why, true
		}
		i := strings.LastIndexByte(n, '/')
		if i < 0 {
			return "", false
		}
		n = n[:i]
	}
}

// outcome is one test's result (PASS, FAIL or SKIP) and the lines go test
// printed under it (a skip's reason, a failure's messages).
type outcome struct{ Result, Detail string }

var (
	resultRE = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+)`)
	runRE    = regexp.MustCompile(`^=== (?:RUN|CONT|NAME)\s+(\S+)`)
)

// parseResults reads `go test -v` output into name -> outcome. A test's
// messages come before its result line, after its === RUN (or CONT, for
// a parallel test resuming).
func parseResults(out []byte) map[string]outcome {
	r := map[string]outcome{}
	detail := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	cur := ""
	for sc.Scan() {
		line := sc.Text()
		if m := resultRE.FindStringSubmatch(line); m != nil {
			r[m[2]] = outcome{Result: m[1], Detail: detail[m[2]]}
			cur = ""
		} else if m := runRE.FindStringSubmatch(line); m != nil {
			cur = m[1]
		} else if cur != "" && strings.HasPrefix(line, "    ") && len(detail[cur]) < 1000 {
			detail[cur] += strings.TrimSpace(line) + " "
		}
	}
	return r
}

// compileSuites builds each suite's test binary, static (CGO_ENABLED=0), so
// that it runs in any image, and returns them with the GOROOT they are from.
func compileSuites(t *testing.T, dir string) (map[string]string, string) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("skip: needs the go tool to compile the standard library's tests: %v", err)
	}
	goroot, err := exec.Command(goBin, "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	bins := map[string]string{}
	for _, p := range suites {
		bin := filepath.Join(dir, strings.ReplaceAll(p, "/", "_")+".test")
		cmd := exec.Command(goBin, "test", "-c", "-o", bin, p)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go test -c %s: %v\n%s", p, err, out)
		}
		bins[p] = bin
	}
	return bins, strings.TrimSpace(string(goroot))
}

// testFlags: -short as in CI, verbose for per-test results; one CPU (the
// sandbox has one) so that both sides schedule alike.
var testFlags = []string{"-test.short", "-test.v", "-test.count=1", "-test.cpu=1", "-test.timeout=150s"}

// suiteEnv is the environment of both runs: no go tool on PATH (the
// sandbox has none, and tests that need it skip on both sides alike) and
// the same HOME and TMPDIR.
var suiteEnv = map[string]string{"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "TMPDIR": "/tmp"}

func TestStdlibSuites(t *testing.T) {
	testenv.RequireRoot(t)
	if runtime.GOOS != "linux" {
		t.Skip("skip: sandboxes are Linux")
	}
	bins, goroot := compileSuites(t, t.TempDir())
	srv := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Image: "busybox"})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	env := map[string]string{"GOROOT": goroot}
	for k, v := range suiteEnv {
		env[k] = v
	}
	// path/filepath walks $GOROOT/src/unicode.
	if _, err := sb.Files().UploadDir(ctx, filepath.Join(goroot, "src/unicode"), goroot+"/src/unicode"); err != nil {
		t.Fatalf("upload GOROOT/src/unicode: %v", err)
	}
	for _, p := range suites {
		// The package's sources and testdata, where its tests expect them
		// (the working directory), and the binary beside them.
		src := filepath.Join(goroot, "src", p)
		dst := "/fidelity/" + p
		if _, err := sb.Files().UploadDir(ctx, src, dst); err != nil {
			t.Fatalf("upload %s: %v", src, err)
		}
		f, err := os.Open(bins[p])
		if err != nil {
			t.Fatal(err)
		}
		_, err = sb.Files().WriteFrom(ctx, dst+"/pkg.test", f, 0o755)
		f.Close()
		if err != nil {
			t.Fatalf("upload %s test binary: %v", p, err)
		}
	}
	for _, p := range suites {
		t.Run(p, func(t *testing.T) {
			host := runOnHost(t, bins[p], filepath.Join(goroot, "src", p), env)
			inside := runInSandbox(ctx, t, sb, "/fidelity/"+p, env)
			compare(t, strings.ReplaceAll(p, "/", "_"), host, inside)
		})
	}
}

// runOnHost runs bin in the package's source directory and parses it.
func runOnHost(t *testing.T, bin, dir string, env map[string]string) map[string]outcome {
	t.Helper()
	cmd := exec.Command(bin, testFlags...)
	cmd.Dir = dir
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	r := parseResults(out)
	if len(r) == 0 {
		t.Fatalf("host run of %s gave no results (%v):\n%s", bin, err, tail(out))
	}
	return r
}

// runInSandbox runs the uploaded binary in dir inside sb and parses it.
func runInSandbox(ctx context.Context, t *testing.T, sb *client.Sandbox, dir string, env map[string]string) map[string]outcome {
	t.Helper()
	res, err := sb.Run(ctx, client.Command{Args: append([]string{dir + "/pkg.test"}, testFlags...),
		Dir: dir, Env: env, Timeout: 3 * time.Minute, OutputLimit: 8 << 20})
	if err != nil {
		t.Fatalf("run in sandbox: %v", err)
	}
	out := append(res.Stdout, res.Stderr...)
	r := parseResults(out)
	if len(r) == 0 {
		t.Fatalf("sandbox run gave no results (exit %d):\n%s", res.ExitCode, tail(out))
	}
	return r
}

// compare requires every test to have the same outcome on both sides,
// except knownDifferences.
func compare(t *testing.T, pkg string, host, inside map[string]outcome) {
	t.Helper()
	names := map[string]bool{}
	for n := range host {
		names[n] = true
	}
	for n := range inside {
		names[n] = true
	}
	var diffs []string
	same := 0
	for n := range names {
		h, s := host[n], inside[n]
		if h.Result == s.Result {
			same++
			continue
		}
		key := pkg + "." + n
		if why, ok := knownDifference(pkg, n); ok {
			t.Logf("known difference %s: host %s, sandbox %s %s: %s", key, h.Result, s.Result, s.Detail, why)
			continue
		}
		diffs = append(diffs, fmt.Sprintf("%s: host %s %s, sandbox %s %s", key, h.Result, h.Detail, s.Result, s.Detail))
	}
	sort.Strings(diffs)
	t.Logf("%s: %d tests with the same result on both sides", pkg, same)
	if len(diffs) > 0 {
		t.Errorf("%d tests differ between the host and a sandbox:\n%s", len(diffs), strings.Join(diffs, "\n"))
	}
}

func tail(b []byte) string {
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// TestFilesystemFidelity runs fscheck (testdata) over a default sandbox's
// root after it made a directory in its writable layer and copied one up
// from the image: every readdir d_ino must equal stat's st_ino (overlay
// directories over EROFS layers with an ext4 upper), no image file may
// be dated before 1980 (zip refuses them), and there is no file size limit.
func TestFilesystemFidelity(t *testing.T) {
	testenv.RequireRoot(t)
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("skip: needs the go tool to build testdata/fscheck: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "fscheck")
	cmd := exec.Command(goBin, "build", "-o", bin, "./testdata/fscheck")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build fscheck: %v\n%s", err, out)
	}
	srv := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	ctx := context.Background()
	f, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := sb.Files().WriteFrom(ctx, "/tmp/fscheck", f, 0o755); err != nil {
		t.Fatal(err)
	}
	testenv.Sh(t, sb, "mkdir -p /work/new/sub && touch /etc/copied-up /work/new/file")
	res := testenv.Run(t, sb, client.Command{Args: []string{"/tmp/fscheck", "/"}})
	out := string(res.Stdout) + string(res.Stderr)
	if res.ExitCode != 0 {
		t.Fatalf("fscheck exited %d:\n%s", res.ExitCode, out)
	}
	t.Logf("%s", out)
	var entries, mismatches, old int
	var fsize string
	last := out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]
	if _, err := fmt.Sscanf(last, "total entries=%d inode_mismatches=%d before_1980=%d fsize=%s", &entries, &mismatches, &old, &fsize); err != nil {
		t.Fatalf("fscheck summary %q: %v", last, err)
	}
	if entries < 100 {
		t.Errorf("walked only %d entries", entries)
	}
	if mismatches != 0 {
		t.Errorf("%d entries whose readdir inode differs from stat's", mismatches)
	}
	if old != 0 {
		t.Errorf("%d files dated before 1980", old)
	}
	if fsize != "unlimited" {
		t.Errorf("RLIMIT_FSIZE %s, want unlimited (the disk quota bounds writes)", fsize)
	}
}
