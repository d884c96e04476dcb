package e2e

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/procfs"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/testenv"
)

// spawners lists the pids of the daemon's spawner children.
func spawners(daemon int) []int {
	var out []int
	for pid, args := range procfs.Cmdlines() {
		if len(args) == 2 && args[1] == "spawner" && parentOf(pid) == daemon {
			out = append(out, pid)
		}
	}
	return out
}

// parentOf reads pid's parent from /proc; -1 when gone or a zombie.
func parentOf(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if f[0] == "Z" {
		return -1
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// oneSpawner waits for exactly one spawner child of the daemon and returns it.
func oneSpawner(t *testing.T, daemon int) int {
	t.Helper()
	var got []int
	waitUntil(t, "one spawner", 10*time.Second, func() bool { got = spawners(daemon); return len(got) == 1 })
	return got[0]
}

// checkSpawnedBy asserts that sb's init is a child of the spawner, and
// that the spawner is in none of the sandboxes' cgroups.
func checkSpawnedBy(t *testing.T, parent string, sb *client.Sandbox, spawner int) {
	t.Helper()
	pids := cgroupPids(parent, sb.ID())
	if len(pids) == 0 {
		t.Fatalf("sandbox %s: no process in its cgroup", sb.ID())
	}
	// Init is the one whose parent is outside the sandbox.
	initPid := -1
	for _, p := range pids {
		if !slices.Contains(pids, parentOf(p)) {
			initPid = p
		}
	}
	if ppid := parentOf(initPid); ppid != spawner {
		t.Errorf("sandbox %s: init %d has parent %d, want the spawner %d", sb.ID(), initPid, ppid, spawner)
	}
	tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(spawner) + "/task")
	for _, task := range tasks {
		cg, _ := os.ReadFile("/proc/" + strconv.Itoa(spawner) + "/task/" + task.Name() + "/cgroup")
		if strings.Contains(string(cg), "/"+parent+"/") || strings.Contains(string(cg), "/"+parent+cgroup.FlatCPUSep) {
			t.Errorf("spawner thread %s is in a sandbox cgroup: %s", task.Name(), cg)
		}
	}
}

// TestSpawnerKilledUnderARunningDaemon: the daemon clones inits through
// its spawner; killed, the spawner is replaced at the next create, the
// sandboxes it started keep working, and it dies with the daemon.
func TestSpawnerKilledUnderARunningDaemon(t *testing.T) {
	testenv.RequireRoot(t)
	d := &daemon{t: t, bins: testenv.Binaries(t), dataDir: t.TempDir(), parent: testenv.UniqueName("corral-test")}
	ctx := context.Background()
	c := d.start("--warm-pool", "0")
	daemonPid := d.cmd.Process.Pid
	first := oneSpawner(t, daemonPid)

	before, err := c.Create(ctx, client.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out := testenv.Sh(t, before, "echo one"); out != "one\n" {
		t.Errorf("sandbox before the kill: %q", out)
	}
	checkSpawnedBy(t, d.parent, before, first)

	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the killed spawner reaped", 10*time.Second, func() bool { return parentOf(first) == -1 })

	after, err := c.Create(ctx, client.CreateOptions{})
	if err != nil {
		t.Fatalf("create after the spawner was killed: %v", err)
	}
	if out := testenv.Sh(t, after, "echo two"); out != "two\n" {
		t.Errorf("sandbox after the kill: %q", out)
	}
	second := oneSpawner(t, daemonPid)
	if second == first {
		t.Fatalf("spawner %d still listed after its kill", first)
	}
	checkSpawnedBy(t, d.parent, after, second)
	// The first sandbox's init, orphaned by the kill, still answers.
	if out := testenv.Sh(t, before, "echo still"); out != "still\n" {
		t.Errorf("sandbox of the killed spawner: %q", out)
	}
	for _, sb := range []*client.Sandbox{before, after} {
		if err := sb.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// A daemon killed outright takes its spawner with it.
	d.stop(syscall.SIGKILL)
	waitUntil(t, "the spawner gone with its daemon", 10*time.Second, func() bool { return parentOf(second) == -1 })

	d.start("--cleanup-on-exit", "--warm-pool", "0")
	d.stop(syscall.SIGTERM)
	testenv.AssertNoLeaks(t, d.dataDir, d.parent)
	testenv.RemoveCgroupParent(d.parent)
}
