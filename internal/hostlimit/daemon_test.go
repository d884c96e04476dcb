package hostlimit_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/testenv"
)

// limitCgroup makes cgroup name in every hierarchy with pids.max = max and
// returns the directories (pids first is not promised).
func limitCgroup(t *testing.T, name string, pidsMax int) []string {
	t.Helper()
	h, err := cgroup.Detect()
	if err != nil {
		t.Skipf("needs cgroups: %v", err)
	}
	seen := map[string]bool{}
	var dirs []string
	for _, mnt := range h.V1 {
		if !seen[mnt] {
			seen[mnt] = true
			dirs = append(dirs, filepath.Join(mnt, name))
		}
	}
	if h.V2 != "" {
		dirs = append(dirs, filepath.Join(h.V2, name))
	}
	pids := h.V1["pids"]
	if pids == "" {
		if !h.V2Controllers["pids"] {
			t.Skip("needs the pids cgroup controller")
		}
		pids = h.V2
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range dirs {
			for _, sub := range []string{"corral", "corral" + cgroup.IdleSuffix} {
				_ = os.Remove(filepath.Join(d, sub))
			}
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				t.Errorf("remove cgroup: %v", err)
			}
		}
	})
	if err := os.WriteFile(filepath.Join(pids, name, "pids.max"), []byte(fmt.Sprint(pidsMax)), 0); err != nil {
		t.Fatal(err)
	}
	return dirs
}

// TestDaemonAtAPidsLimit runs `corral serve` inside a pids cgroup of 260
// tasks that also holds its sandboxes, creates until refused, and checks
// that the refusal is a clear ResourceExhausted naming the limit while the
// daemon and the sandboxes it holds keep working, also while one of them
// fork-bombs up to the sandboxes' cap; with corral-init as PID 1 and with
// the init stub, whose sandboxes start a server per exec.
func TestDaemonAtAPidsLimit(t *testing.T) {
	t.Run("corral-init", func(t *testing.T) { daemonAtAPidsLimit(t, "thl0") })
	// Every sandbox keeps its server's headroom (serving share 1): the
	// test execs into each in turn, and each server lingers after.
	t.Run("stub", func(t *testing.T) { daemonAtAPidsLimit(t, "thl1", "--init-stub", "--init-stub-serving", "1") })
}

func daemonAtAPidsLimit(t *testing.T, bridge string, flags ...string) {
	testenv.RequireRoot(t)
	bins := testenv.Binaries(t)
	name := testenv.UniqueName("t-hostlimit")
	dirs := limitCgroup(t, name, 260)
	data, err := os.MkdirTemp("", "corral-hostlimit-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(data)
	sock := filepath.Join(data, "corral.sock")
	// The shell moves itself into the limited cgroup, then becomes the daemon.
	var enter strings.Builder
	for _, d := range dirs {
		fmt.Fprintf(&enter, "echo $$ > %s/cgroup.procs && ", d)
	}
	args := append([]string{"-c", enter.String() + `exec "$@"`, "sh",
		filepath.Join(bins, "corral"), "serve", "--data-dir", data, "--socket", sock, "--listen", "",
		"--cgroup-parent", name + "/corral", "--init-binary", filepath.Join(bins, "corral-init"),
		"--no-raise-limits", "--cleanup-on-exit", "--net-bridge", bridge, "--log-level", "warn"}, flags...)
	cmd := exec.Command("/bin/sh", args...)
	logf, err := os.Create(filepath.Join(data, "daemon.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed when the daemon has exited (waitErr then says how):
	// closed, so that waitServing and the cleanup below both see it.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(data, "daemon.log"))
			t.Logf("daemon log:\n%s", b)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := waitServing(ctx, t, sock, exited, &waitErr)
	defer c.Close()

	var sbs []*client.Sandbox
	defer func() {
		for _, sb := range sbs {
			_ = sb.Delete(context.Background())
		}
	}()
	var refusal error
	for range 60 {
		sb, err := c.Create(ctx, client.CreateOptions{Labels: map[string]string{"t": "hostlimit"}})
		if err != nil {
			refusal = err
			break
		}
		sbs = append(sbs, sb)
	}
	if refusal == nil {
		t.Fatalf("60 creates under a 260-task cgroup: none refused")
	}
	if !client.IsResourceExhausted(refusal) || !strings.Contains(refusal.Error(), "pids.max") ||
		!strings.Contains(refusal.Error(), "limit 260") {
		t.Fatalf("refusal after %d creates: %v; want resource exhausted naming pids.max and its limit", len(sbs), refusal)
	}
	t.Logf("%d sandboxes, then: %v", len(sbs), refusal)
	if len(sbs) < 3 {
		t.Fatalf("only %d sandboxes fit", len(sbs))
	}
	for i, sb := range sbs {
		if res, err := sb.Run(ctx, client.Command{Args: []string{"echo", "ok"}}); err != nil || res.ExitCode != 0 {
			t.Fatalf("exec in sandbox %d at the limit: %v %+v", i, err, res)
		}
	}

	// One sandbox forks until the sandboxes' cap: the daemon keeps its
	// reserve, answers, and refuses creates cleanly.
	bomb := sbs[0]
	go func() {
		_, _ = bomb.Run(ctx, client.Command{Shell: "while :; do sleep 60 & done", Timeout: time.Minute})
	}()
	time.Sleep(3 * time.Second)
	if _, err := c.List(ctx, client.ListOptions{}); err != nil {
		t.Fatalf("list while a sandbox holds every PID it may: %v", err)
	}
	if _, err := c.Create(ctx, client.CreateOptions{}); !client.IsResourceExhausted(err) {
		t.Fatalf("create during the fork bomb: %v, want resource exhausted", err)
	}
	if err := bomb.Delete(ctx); err != nil {
		t.Fatalf("delete the fork-bombing sandbox: %v", err)
	}
	sbs = sbs[1:]
	select {
	case <-exited:
		t.Fatalf("daemon exited: %v", waitErr)
	default:
	}
	// Its PIDs are back: the others exec, and once four more are deleted
	// (the daemon's own threads share the cgroup, and their number moves
	// with its load) creates fit again.
	for i, sb := range sbs {
		if res, err := sb.Run(ctx, client.Command{Args: []string{"true"}}); err != nil || res.ExitCode != 0 {
			t.Fatalf("exec in sandbox %d after the bomb: %v %+v", i, err, res)
		}
	}
	for _, sb := range sbs[:4] {
		if err := sb.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sbs = sbs[4:]
	deadline := time.Now().Add(10 * time.Second)
	for {
		time.Sleep(300 * time.Millisecond) // past the guard's sampling interval
		sb, err := c.Create(ctx, client.CreateOptions{})
		if err == nil {
			sbs = append(sbs, sb)
			break
		}
		if !client.IsResourceExhausted(err) || time.Now().After(deadline) {
			t.Fatalf("create after five sandboxes were deleted: %v", err)
		}
	}
}

func waitServing(ctx context.Context, t *testing.T, sock string, exited <-chan struct{}, waitErr *error) *client.Client {
	t.Helper()
	for {
		select {
		case <-exited:
			t.Fatalf("daemon exited at start: %v", *waitErr)
		case <-ctx.Done():
			t.Fatal("daemon did not start")
		case <-time.After(100 * time.Millisecond):
		}
		if _, err := os.Stat(sock); err != nil {
			continue
		}
		c, err := client.New("unix://" + sock)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.List(ctx, client.ListOptions{}); err == nil {
			return c
		}
		c.Close()
	}
}
