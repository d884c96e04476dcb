package qemu

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/qmp"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// startBare starts QEMU with no guest (machine "none") under SandboxArgs,
// plus extra, as the backends start their VMMs.
func startBare(t *testing.T, ctx context.Context, extra ...string) (*launch.Process, *qmp.Client) {
	t.Helper()
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("needs qemu-system-x86_64 (package qemu-system-x86)")
	}
	dir := t.TempDir()
	l := Launch{Dir: dir, Log: filepath.Join(dir, "qemu.log"), QMP: filepath.Join(dir, "qmp.sock")}
	l.Args = append([]string{bin, "-M", "none", "-nodefaults", "-display", "none", "-qmp", "unix:" + l.QMP + ",server=on,wait=off"}, SandboxArgs...)
	l.Args = append(l.Args, extra...)
	proc, qc, err := Start(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qc.Close(); _ = proc.Kill(); <-proc.Done() })
	return proc, qc
}

// TestVMMCannotSpawn: under SandboxArgs a VMM that tries to start a
// program (here through an "exec:" migration URI, as a compromised QEMU
// would) is killed by its seccomp filter and the program never runs;
// snapshots still stream, through descriptors the daemon opened: a
// machine's state saved to a file loads into a second VMM.
func TestVMMCannotSpawn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	proc, qc := startBare(t, ctx)
	mark := filepath.Join(t.TempDir(), "spawned")
	_, _ = qc.Run(ctx, "migrate", map[string]any{"uri": "exec:touch " + mark})
	select {
	case <-proc.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a VMM that spawned a process still runs")
	}
	if _, err := os.Stat(mark); !os.IsNotExist(err) {
		t.Errorf("the VMM's spawned program ran: %v", err)
	}

	_, qc = startBare(t, ctx)
	state := filepath.Join(t.TempDir(), "state")
	if _, err := qc.Run(ctx, "stop", nil); err != nil {
		t.Fatal(err)
	}
	if err := migrateTo(ctx, qc, state); err != nil {
		t.Fatalf("save through a descriptor: %v", err)
	}
	b, err := os.ReadFile(state)
	if err != nil || !bytes.HasPrefix(b, []byte("QEVM")) {
		t.Fatalf("saved state: %d bytes, %v; want a QEMU migration stream", len(b), err)
	}
	_, qc = startBare(t, ctx, IncomingArgs...)
	if err := Incoming(ctx, qc, state, false); err != nil {
		t.Fatalf("load through a descriptor: %v", err)
	}
	if st, err := qc.Status(ctx); err != nil || st != "running" {
		t.Errorf("after the load: %q %v, want running", st, err)
	}
}
