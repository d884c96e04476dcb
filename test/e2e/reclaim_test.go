package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/storage/layers"
	"github.com/corral-dev/corral/internal/testenv"
)

const holderMiB = 200

// pythonHolder is memholder (testdata/memholder) in python, for the
// debian image.
const pythonHolder = `
import hashlib, os, random, time
def put(p, s):
    open(p + ".tmp", "w").write(s); os.rename(p + ".tmp", p)
data = bytearray(random.Random(1).randbytes(%d << 20))
put("/tmp/hash0", hashlib.sha256(data).hexdigest())
n = 0
while True:
    n += 1
    put("/tmp/counter", str(n))
    if os.path.exists("/tmp/check"):
        os.remove("/tmp/check")
        put("/tmp/check.out", "%%d %%s" %% (n, hashlib.sha256(data).hexdigest()))
    time.sleep(0.02)
`

func withSwap(c *server.Config) { c.SwapBytes = 512 << 20 }

// startHolder starts a process holding holderMiB of memory in a new
// sandbox: python on the debian image with CORRAL_TEST_DEBIAN=1 (it builds
// the image, about a minute), else the static memholder on busybox.
func startHolder(t *testing.T, srv *testenv.Server) *client.Sandbox {
	t.Helper()
	ctx := context.Background()
	opts := client.CreateOptions{Resources: client.Resources{MemoryBytes: 512 << 20}}
	script := ""
	if os.Getenv("CORRAL_TEST_DEBIAN") != "" {
		images, err := layers.Open(ctx, filepath.Join(srv.Config.DataDir, "images"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := images.Build(ctx, "debian", nil); err != nil {
			t.Fatal(err)
		}
		opts.Image = "debian"
		script = fmt.Sprintf("python3 -c '%s' >/dev/null 2>&1 &", fmt.Sprintf(pythonHolder, holderMiB))
	}
	sb := testenv.NewSandbox(t, srv.Client, opts)
	if script == "" {
		bin := filepath.Join(t.TempDir(), "memholder")
		build := exec.Command("go", "build", "-o", bin, "./testdata/memholder")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build memholder: %v\n%s", err, out)
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if err := sb.Files().Write(ctx, "/tmp/memholder", data); err != nil {
			t.Fatal(err)
		}
		script = fmt.Sprintf("chmod +x /tmp/memholder && /tmp/memholder %d >/dev/null 2>&1 &", holderMiB)
	}
	testenv.Sh(t, sb, script)
	waitFor(t, func() bool {
		return testenv.Run(t, sb, client.Command{Args: []string{"test", "-s", "/tmp/hash0"}}).ExitCode == 0
	})
	return sb
}

// TestReclaimKeepsMemoryIntact: a process holding 200 MiB, after pause
// with reclaim, keeps under 5% of its memory in RAM; an exec resumes the
// sandbox and the process goes on counting with its memory unchanged.
func TestReclaimKeepsMemoryIntact(t *testing.T) {
	srv := testenv.StartServer(t, withSwap)
	ctx := context.Background()
	sb := startHolder(t, srv)
	hash0 := testenv.Sh(t, sb, "cat /tmp/hash0")
	info, err := sb.Info(ctx)
	if err != nil || info.Memory == nil || info.Memory.ResidentBytes < holderMiB<<20 {
		t.Fatalf("before: %v %+v", err, info.Memory)
	}
	r, err := sb.Reclaim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reclaim: resident %d -> %d bytes, swapped %d", r.ResidentBeforeBytes, r.ResidentAfterBytes, r.SwappedBytes)
	if r.ResidentAfterBytes*20 > r.ResidentBeforeBytes || r.SwappedBytes < holderMiB<<20*3/4 {
		t.Fatalf("reclaim left %d of %d bytes resident (want under 5%%), %d swapped", r.ResidentAfterBytes, r.ResidentBeforeBytes, r.SwappedBytes)
	}
	info, err = sb.Info(ctx)
	if err != nil || info.State != client.StatePaused || info.Memory == nil || !info.Memory.Reclaimed || info.Memory.ResidentBytes*20 > r.ResidentBeforeBytes {
		t.Fatalf("after reclaim: %v state %s memory %+v", err, info.State, info.Memory)
	}
	// The exec resumes the sandbox transparently.
	paused, _ := strconv.Atoi(testenv.Sh(t, sb, "cat /tmp/counter"))
	testenv.Sh(t, sb, "touch /tmp/check")
	var out string
	waitFor(t, func() bool {
		res := testenv.Run(t, sb, client.Command{Shell: "cat /tmp/check.out 2>/dev/null"})
		out = string(res.Stdout)
		return out != ""
	})
	f := strings.Fields(out)
	if n, _ := strconv.Atoi(f[0]); len(f) != 2 || n <= paused || f[1] != hash0 {
		t.Fatalf("after resume: check %q, counter at pause %d, hash before %s", out, paused, hash0)
	}
	if info, err = sb.Info(ctx); err != nil || info.State != client.StateRunning || info.Memory.Reclaimed {
		t.Fatalf("after the exec: %v %s %+v", err, info.State, info.Memory)
	}
}

// TestReclaimErrors: without a swap area a reclaim fails and the sandbox
// keeps running; bad idle actions are refused at create with nothing made.
func TestReclaimErrors(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	if _, err := sb.Reclaim(ctx); !client.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "--swap") {
		t.Fatalf("reclaim without swap: %v", err)
	}
	if info, err := sb.Info(ctx); err != nil || info.State != client.StateRunning {
		t.Fatalf("after the failed reclaim: %v %+v", err, info)
	}
	if _, err := srv.Client.Create(ctx, client.CreateOptions{IdleAction: "reclaim"}); !client.IsFailedPrecondition(err) {
		t.Fatalf("idle_action reclaim without swap: %v", err)
	}
	if _, err := srv.Client.Create(ctx, client.CreateOptions{IdleAction: "hibernate"}); !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "idle_action") {
		t.Fatalf("idle_action hibernate: %v", err)
	}
	if _, err := srv.Client.PauseMany(ctx, nil, false); !client.IsInvalidArgument(err) {
		t.Fatalf("PauseMany without labels: %v", err)
	}
	if _, err := srv.Client.Sandbox(srv.NodeID() + "-000000000000").Reclaim(ctx); !client.IsNotFound(err) {
		t.Fatalf("reclaim of an unknown sandbox: %v", err)
	}
	if all, err := srv.Client.List(ctx, client.ListOptions{}); err != nil || len(all) != 1 {
		t.Fatalf("sandboxes after the refused creates: %v %d", err, len(all))
	}
}

// TestIdleActionPause: an idle sandbox with idle action pause is paused,
// not stopped, and the next request resumes it.
func TestIdleActionPause(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	idle := time.Second
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{IdleTimeout: &idle, IdleAction: "pause"})
	waitFor(t, func() bool {
		info, err := sb.Info(ctx)
		return err == nil && info.State == client.StatePaused
	})
	if got := testenv.Sh(t, sb, "echo up"); got != "up\n" {
		t.Fatalf("exec after the idle pause: %q", got)
	}
}

// TestPauseManyByLabel pauses and resumes a job by its label; sandboxes
// of another job stay running. 48 sandboxes are three rounds of the
// node's 16 at once; a job of 500 is `corral bench pause --job 500`
// (making 500 containers takes longer here than a test should).
func TestPauseManyByLabel(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	const n = 48
	job := map[string]string{"job": testenv.UniqueName("job")}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 8)
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if _, err := srv.Client.Create(ctx, client.CreateOptions{Labels: job, Resources: client.Resources{MemoryBytes: 32 << 20}}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	other := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Labels: map[string]string{"job": "other"}})
	count := func(s client.State) int {
		l, err := srv.Client.List(ctx, client.ListOptions{Labels: job, State: s, PageSize: 16}) // several pages, as 500 had
		if err != nil {
			t.Fatal(err)
		}
		return len(l)
	}
	r, err := srv.Client.PauseMany(ctx, job, false)
	if err != nil || r.Done != n || len(r.Failures) != 0 {
		t.Fatalf("PauseMany: %v %+v", err, r)
	}
	if got := count(client.StatePaused); got != n {
		t.Fatalf("%d of %d paused", got, n)
	}
	if info, err := other.Info(ctx); err != nil || info.State != client.StateRunning {
		t.Fatalf("the other job's sandbox: %v %+v", err, info)
	}
	if r, err = srv.Client.ResumeMany(ctx, job); err != nil || r.Done != n || len(r.Failures) != 0 {
		t.Fatalf("ResumeMany: %v %+v", err, r)
	}
	if got := count(client.StateRunning); got != n {
		t.Fatalf("%d of %d running after ResumeMany", got, n)
	}
}

// TestMicroVMReclaimSurvivesDaemonKill: a microVM paused with reclaim is a
// snapshot on disk (no VMM, no RAM); after a SIGKILL of the daemon and a
// restart, an exec restores it and its running process goes on counting.
func TestMicroVMReclaimSurvivesDaemonKill(t *testing.T) {
	requireMicroVM(t)
	d := newDaemon(t)
	ctx := context.Background()
	c := d.start("--microvm-snapshot-after", "1h") // only reclaim snapshots
	sb, err := c.Create(ctx, client.CreateOptions{Backend: "microvm", Resources: client.Resources{MemoryBytes: 256 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	testenv.StartCounter(t, sb)
	r, err := sb.Reclaim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.ResidentBeforeBytes == 0 || r.ResidentAfterBytes != 0 || r.SwappedBytes == 0 {
		t.Fatalf("microVM reclaim: %+v, want no RAM left and a snapshot on disk", r)
	}
	d.stop(syscall.SIGKILL)
	c = d.start("--cleanup-on-exit")
	sb = c.Sandbox(sb.ID())
	if info, err := sb.Info(ctx); err != nil || info.State != client.StatePaused {
		t.Fatalf("after the restart: %v %+v", err, info)
	}
	testenv.AssertCounting(t, "after the restore", sb, 1)
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	d.stopLeavingNothing()
}

// TestForkContainerFiles: forks of a container start from its files and
// go their own ways; processes are not carried; bad counts make nothing.
func TestForkContainerFiles(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	parent := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Labels: map[string]string{"job": "fork"}})
	testenv.Sh(t, parent, "mkdir -p /work; echo step-3 > /work/state; sleep 1000 >/dev/null 2>&1 &")
	for _, n := range []int{0, 65} {
		if _, err := parent.Fork(ctx, n); !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "count") {
			t.Errorf("fork × %d: %v, want invalid argument naming count", n, err)
		}
	}
	if _, err := srv.Client.Sandbox(srv.NodeID()+"-000000000000").Fork(ctx, 2); !client.IsNotFound(err) {
		t.Errorf("fork of an unknown sandbox: %v", err)
	}
	if all, _ := srv.Client.List(ctx, client.ListOptions{}); len(all) != 1 {
		t.Fatalf("%d sandboxes after refused forks, want 1", len(all))
	}
	res, err := parent.Fork(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if res.ProcessesCarried || len(res.Forks) != 3 || res.Image == "" {
		t.Fatalf("fork result: %+v", res)
	}
	for i, f := range res.Forks {
		if f.Err != nil {
			t.Fatalf("fork %d: %v", i, f.Err)
		}
		t.Cleanup(func() { _ = f.Sandbox.Delete(context.Background()) })
		if f.Info.Labels["job"] != "fork" || f.Info.Labels["corral.fork-of"] != parent.ID() {
			t.Errorf("fork %d labels: %v", i, f.Info.Labels)
		}
		if got := testenv.Sh(t, f.Sandbox, "cat /work/state"); got != "step-3\n" {
			t.Errorf("fork %d /work/state = %q", i, got)
		}
		if got := testenv.Sh(t, f.Sandbox, "ps -o args | grep -c '^sleep 1000' || true"); got != "0\n" {
			t.Errorf("fork %d carries the parent's process: %q", i, got)
		}
		testenv.Sh(t, f.Sandbox, fmt.Sprintf("echo fork-%d >> /work/state", i))
	}
	if got := testenv.Sh(t, parent, "cat /work/state; ps -o args | grep -c '^sleep 1000'"); got != "step-3\n1\n" {
		t.Errorf("parent after the forks wrote theirs: %q, want its state and its sleep", got)
	}
	if got := testenv.Sh(t, res.Forks[1].Sandbox, "cat /work/state"); got != "step-3\nfork-1\n" {
		t.Errorf("fork 1 /work/state: %q", got)
	}
}
