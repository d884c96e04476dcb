package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

// newDaemon is a daemon of the test binaries over a fresh data dir and
// cgroup parent (it skips without root).
func newDaemon(t *testing.T) *daemon {
	t.Helper()
	testenv.RequireRoot(t)
	return &daemon{t: t, bins: testenv.Binaries(t), dataDir: t.TempDir(), parent: testenv.UniqueName("corral-test")}
}

// daemon is `corral serve` as a child process, so the test can SIGKILL it.
type daemon struct {
	t       *testing.T
	bins    string
	dataDir string
	parent  string
	cmd     *exec.Cmd
	exited  chan struct{}
	swept   bool // sweep ran
}

func (d *daemon) start(extra ...string) *client.Client {
	d.t.Helper()
	args := append([]string{"serve", "--data-dir", d.dataDir, "--listen", "", "--cgroup-parent", d.parent,
		"--init-binary", filepath.Join(d.bins, "corral-init"), "--disk-pool", "4Gi", "--log-level", "warn",
		"--no-raise-limits"}, extra...) // tests leave the shared host's settings alone
	d.cmd = exec.Command(filepath.Join(d.bins, "corral"), args...)
	d.cmd.Stdout, d.cmd.Stderr = os.Stderr, os.Stderr
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.exited = make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(d.exited) }()
	// A test that fails half-way must not leave its daemon running, nor
	// the sandboxes a daemon keeps across its exit.
	cmd, exited := d.cmd, d.exited
	d.t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-exited
		}
		if d.t.Failed() {
			d.sweep(args)
		}
	})
	c, err := client.New("unix://" + filepath.Join(d.dataDir, "corral.sock"))
	if err != nil {
		d.t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := c.List(context.Background(), client.ListOptions{}); err == nil {
			return c
		}
		select {
		case <-d.exited:
			d.t.Fatalf("daemon exited during start: %v", d.cmd.ProcessState)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("daemon did not come up in 60s")
		}
	}
}

// sweep deletes what a failed test left in the data dir: a daemon with
// the test's flags and --cleanup-on-exit recovers every recorded sandbox
// and deletes them all when stopped. It runs once per daemon.
func (d *daemon) sweep(args []string) {
	if d.swept {
		return
	}
	d.swept = true
	cmd := exec.Command(filepath.Join(d.bins, "corral"), append(args, "--cleanup-on-exit")...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		d.t.Logf("sweep after the failure: %v", err)
		return
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	c, err := client.New("unix://" + filepath.Join(d.dataDir, "corral.sock"))
	if err == nil {
		defer c.Close()
		deadline := time.After(time.Minute)
	wait:
		for {
			if _, err = c.List(context.Background(), client.ListOptions{}); err == nil {
				break
			}
			select {
			case <-exited:
				break wait
			case <-deadline:
				break wait
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	if err != nil {
		d.t.Logf("sweep after the failure: the daemon does not answer: %v", err)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(2 * time.Minute):
		d.t.Logf("sweep after the failure: the daemon did not stop in 2 min; killing it")
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
	testenv.RemoveCgroupParent(d.parent)
}

func (d *daemon) stop(sig syscall.Signal) {
	d.t.Helper()
	_ = d.cmd.Process.Signal(sig)
	<-d.exited
}

// stopLeavingNothing stops the daemon with SIGTERM, checks that nothing
// of it is left on the host and removes its cgroup parent.
func (d *daemon) stopLeavingNothing() {
	d.t.Helper()
	d.stop(syscall.SIGTERM)
	testenv.AssertNoLeaks(d.t, d.dataDir, d.parent)
	testenv.RemoveCgroupParent(d.parent)
}

// cgroupPids lists the processes in a sandbox's pids cgroup (v1) or its v2 dir.
func cgroupPids(parent, id string) []int {
	var pids []int
	for _, f := range []string{"/sys/fs/cgroup/pids/" + parent + "/" + id + "/cgroup.procs", "/sys/fs/cgroup/" + parent + "/" + id + "/cgroup.procs"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(s); err == nil {
				pids = append(pids, pid)
			}
		}
		break
	}
	return pids
}

func TestDaemonCrashKeepsOrCleansEverySandbox(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	c := d.start()

	survivor, err := c.Create(ctx, client.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Sh(t, survivor, "echo kept > /tmp/state; sleep 1000 >/dev/null 2>&1 &")
	victim, err := c.Create(ctx, client.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	paused, err := c.Create(ctx, client.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := paused.Pause(ctx); err != nil {
		t.Fatal(err)
	}

	d.stop(syscall.SIGKILL)
	// While the daemon is down, the victim's processes die, and a stray
	// cgroup appears that no record describes, with the run dir a crash
	// between create steps leaves (made before the cgroup): the daemon's
	// own, so swept.
	for _, pid := range cgroupPids(d.parent, victim.ID()) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	strayID := strings.Split(survivor.ID(), "-")[0] + "-0123456789ab"
	stray := "/sys/fs/cgroup/pids/" + d.parent + "/" + strayID
	if err := os.Mkdir(stray, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(d.dataDir, "run", strayID), 0o700); err != nil {
		t.Fatal(err)
	}

	c = d.start()
	if out := testenv.Sh(t, survivor, "cat /tmp/state; ps -o comm | grep -c sleep"); out != "kept\n1\n" {
		t.Errorf("survivor after restart: %q", out)
	}
	// Its layers stay pinned across the restart.
	if _, err := c.RemoveImage(ctx, "busybox@1"); !client.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "sandbox "+survivor.ID()) {
		t.Errorf("remove a layer a surviving sandbox uses: %v", err)
	}
	info, err := c.Get(ctx, victim.ID())
	if err != nil || info.State != client.StateStopped {
		t.Errorf("victim after restart: %+v %v", info, err)
	}
	lost := readEvents(t, c, 0, 1, client.EventOptions{SandboxIDs: []string{victim.ID()}, Types: []string{client.EventStopped}})
	if len(lost) != 1 || !strings.Contains(lost[0].Reason, "lost at daemon restart") {
		t.Errorf("stopped event of the victim: %+v", lost)
	}
	if pids := cgroupPids(d.parent, victim.ID()); len(pids) != 0 {
		t.Errorf("victim processes left: %v", pids)
	}
	if _, err := os.Stat(stray); !os.IsNotExist(err) {
		t.Errorf("stray cgroup %s not swept: %v", stray, err)
	}
	if info, err := c.Get(ctx, paused.ID()); err != nil || info.State != client.StatePaused {
		t.Errorf("paused sandbox after restart: %+v %v", info, err)
	}
	if out := testenv.Sh(t, paused, "echo thawed"); out != "thawed\n" {
		t.Errorf("paused sandbox exec after restart: %q", out)
	}

	// A clean shutdown with --cleanup-on-exit removes everything.
	d.stop(syscall.SIGTERM)
	d.start("--cleanup-on-exit")
	d.stop(syscall.SIGTERM)
	if d.cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("daemon exit code %d", d.cmd.ProcessState.ExitCode())
	}
	testenv.AssertNoLeaks(t, d.dataDir, d.parent)
	testenv.RemoveCgroupParent(d.parent)
}
