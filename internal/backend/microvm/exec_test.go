package microvm

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

// TestExecAndFiles: commands run in the guest with their exit code and
// output, and files written through the API are what the guest sees (and
// the other way round).
func TestExecAndFiles(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, testSpec(t))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	if got := sh(t, sb, "uname -r; hostname"); !strings.Contains(got, "sandbox") {
		t.Errorf("uname/hostname = %q", got)
	}
	res, out, errOut := run(t, sb, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "cat; echo err >&2; exit 7"},
		Stdin: []byte("from stdin"), Env: []string{"PATH=/bin"}, Cwd: "/"})
	if res.ExitCode != 7 || out != "from stdin" || errOut != "err\n" {
		t.Errorf("exit %d stdout %q stderr %q; want 7, stdin echoed, err", res.ExitCode, out, errOut)
	}

	data := bytes.Repeat([]byte("corral "), 30000) // several frames
	if n, err := sb.WriteFile(ctx, "/work/a.txt", bytes.NewReader(data), backend.WriteOptions{Mode: 0o640, MakeParents: true}); err != nil || n != int64(len(data)) {
		t.Fatalf("write: %d, %v", n, err)
	}
	if got := sh(t, sb, "wc -c < /work/a.txt; stat -c %a /work/a.txt"); strings.Fields(got)[0] != "210000" || strings.Fields(got)[1] != "640" {
		t.Errorf("guest sees %q, want 210000 bytes, mode 640", got)
	}
	sh(t, sb, "echo made-inside > /work/b.txt")
	r, err := sb.ReadFile(ctx, "/work/b.txt", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || string(got) != "made-inside\n" {
		t.Errorf("read = %q, %v", got, err)
	}
	ents, err := sb.ListDir(ctx, "/work")
	if err != nil || len(ents) != 2 {
		t.Errorf("list = %v, %v; want 2 entries", ents, err)
	}
	if _, err := sb.Stat(ctx, "/work/../../etc/../work/a.txt"); err != nil {
		t.Errorf("stat with .. inside the root: %v", err)
	}
	if err := sb.Remove(ctx, "/work", true); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Stat(ctx, "/work"); err == nil {
		t.Error("/work still there after remove")
	}

	// The output cap holds: a flood is cut at the limit.
	res, out, _ = run(t, sb, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "yes"}, Env: []string{"PATH=/bin"},
		Cwd: "/", OutputLimit: 100000, Timeout: time.Minute})
	if !res.Truncated || len(out) != 100000 || res.TimedOut {
		t.Errorf("yes: truncated=%v len=%d timedout=%v; want truncated at 100000", res.Truncated, len(out), res.TimedOut)
	}
	// A timeout kills the command.
	res, _, _ = run(t, sb, backend.ExecSpec{Argv: []string{"sleep", "600"}, Env: []string{"PATH=/bin"}, Cwd: "/", Timeout: 2 * time.Second})
	if !res.TimedOut || res.Signal != 9 {
		t.Errorf("sleep: timedout=%v signal=%d; want a SIGKILL on timeout", res.TimedOut, res.Signal)
	}
}
