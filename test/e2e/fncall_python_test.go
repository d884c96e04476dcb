package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/storage/layers"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestFnCallWarmPython checks python calls on the warm python: verdicts,
// and isolation between consecutive calls on one sandbox and its one warm
// interpreter. It builds the debian image (about 30 s), so it runs only
// with CORRAL_TEST_DEBIAN=1.
func TestFnCallWarmPython(t *testing.T) {
	if os.Getenv("CORRAL_TEST_DEBIAN") == "" {
		t.Skip("skip: set CORRAL_TEST_DEBIAN=1 to build the debian image and test python calls")
	}
	srv := testenv.StartServer(t, onePool)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	images, err := layers.Open(ctx, filepath.Join(srv.Config.DataDir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := images.Build(ctx, "debian", nil); err != nil {
		t.Fatal(err)
	}
	c := srv.Client
	py := func(src string, mod ...func(*client.CallOptions)) *client.CallResult {
		o := client.CallOptions{Language: "python", Source: src}
		for _, m := range mod {
			m(&o)
		}
		return call(t, c, o)
	}
	const ids = "import os; print(open('/proc/1/stat').read().split()[21], os.getppid())"
	r1 := py(ids + "\nimport os, subprocess, sys\nos.environ['LEAK']='1'; sys.modules['json'].LEAK = 1\n" +
		"subprocess.Popen(['sleep', '1000'])\nopen('/tmp/left', 'w').write('x')")
	r2 := py(ids + "\nimport os, json, subprocess\nprint(os.path.exists('/tmp/left'), os.environ.get('LEAK'), hasattr(json, 'LEAK'))\n" +
		"print(subprocess.run(['ps', '-e', '-o', 'comm='], capture_output=True, text=True).stdout.count('sleep'))")
	l1 := strings.Split(string(r1.Stdout), "\n")[0]
	lines := strings.Split(string(r2.Stdout), "\n")
	if strings.Fields(l1)[0] != strings.Fields(lines[0])[0] {
		t.Fatalf("calls ran on different sandboxes (%q, %q)", l1, lines[0])
	}
	if lines[1] != "False None False" || lines[2] != "0" {
		t.Fatalf("call 2 sees call 1's state: %q (stderr %q)", r2.Stdout, r2.Stderr)
	}
	// Clean calls reuse one warm interpreter (the parent pid stays).
	r3, r4 := py(ids), py(ids)
	if string(r3.Stdout) != string(r4.Stdout) {
		t.Errorf("clean calls did not share the warm python: %q %q", r3.Stdout, r4.Stdout)
	}
	for _, tc := range []struct {
		src  string
		mod  func(*client.CallOptions)
		want client.Verdict
	}{
		{"print(sum(range(1000)))", nil, client.VerdictOK},
		{"import sys; sys.exit(3)", nil, client.VerdictRuntimeError},
		{"raise ValueError('x')", nil, client.VerdictRuntimeError},
		{"while True: pass", func(o *client.CallOptions) { o.WallTimeout = 500 * time.Millisecond }, client.VerdictTimeLimit},
		{"while True: pass", func(o *client.CallOptions) { o.CPUTimeout = time.Second }, client.VerdictTimeLimit},
		{"x = bytearray(300 << 20)", func(o *client.CallOptions) { o.MemoryBytes = 64 << 20 }, client.VerdictMemoryLimit},
		{"print('y' * 10**7)", func(o *client.CallOptions) { o.OutputLimit = 1000 }, client.VerdictOutputLimit},
		{"import os; os.kill(os.getppid(), 9)", nil, client.VerdictRuntimeError},
		{"print(input()[::-1])", func(o *client.CallOptions) { o.Stdin = []byte("abc\n") }, client.VerdictOK},
	} {
		mods := []func(*client.CallOptions){}
		if tc.mod != nil {
			mods = append(mods, tc.mod)
		}
		r := py(tc.src, mods...)
		if r.Verdict != tc.want {
			t.Errorf("%q: verdict %s, want %s (exit %d, signal %d, stderr %q)", tc.src, r.Verdict, tc.want, r.ExitCode, r.Signal, r.Stderr)
		}
	}
	if r := py("print(input()[::-1])", func(o *client.CallOptions) { o.Stdin = []byte("abc\n") }); string(r.Stdout) != "cba\n" {
		t.Errorf("stdin: %q", r.Stdout)
	}
	if r := py("import sys; sys.exit(3)"); r.ExitCode != 3 {
		t.Errorf("exit 3: %d", r.ExitCode)
	}
	// A call cannot tamper with the warm python for later calls.
	r := py("import os, resource; resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (3, 3))")
	if !strings.Contains(string(r.Stderr), "PermissionError") {
		t.Errorf("prlimit on the warm python: %s %q", r.Verdict, r.Stderr)
	}
	r = py("import os; print(open('/proc/%d/mem' % os.getppid(), 'rb').read(1))")
	if !strings.Contains(string(r.Stderr), "PermissionError") {
		t.Errorf("read the warm python's memory: %s %q", r.Verdict, r.Stderr)
	}
}
