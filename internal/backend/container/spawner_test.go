package container

import (
	"bytes"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/runtime/launch"
)

// parentPid reads pid's parent from /proc/<pid>/stat.
func parentPid(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	ppid, err := strconv.Atoi(strings.Fields(s[strings.LastIndexByte(s, ')')+2:])[1])
	if err != nil {
		t.Fatal(err)
	}
	return ppid
}

// TestInitsComeFromTheSpawner: init's parent is the spawner, not the
// daemon (which then never forks itself for a create).
func TestInitsComeFromTheSpawner(t *testing.T) {
	b := newBackend(t)
	sp := b.spawner.Pid()
	if sp == 0 {
		t.Fatal("no spawner running")
	}
	s := newSandbox(t, b, nil)
	if r := sh(t, s, "echo ok"); r.stdout != "ok\n" {
		t.Fatalf("exec: %+v", r)
	}
	pid := s.(*sandbox).proc.Pid
	if got := parentPid(t, pid); got != sp {
		t.Errorf("init's parent is %d, want the spawner %d (the test process is %d)", got, sp, os.Getpid())
	}
	// The spawner placed init in every v1 hierarchy of the sandbox.
	cg, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	placed := 0
	for _, line := range strings.Split(string(cg), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" || c == "pids" || c == "cpu" || c == "blkio" || c == "freezer" {
				if !strings.Contains(parts[2], s.ID()) {
					t.Errorf("init's %s cgroup is %s, not the sandbox's", c, parts[2])
				}
				placed++
			}
		}
	}
	if placed == 0 {
		t.Errorf("no v1 hierarchy in init's cgroups:\n%s", cg)
	}
}

// TestSpawnWithoutASpawner: a spawner that cannot start leaves a log line
// and creates spawning directly (as the daemon's children).
func TestSpawnWithoutASpawner(t *testing.T) {
	b := newBackend(t)
	b.spawner.Close()
	var logs bytes.Buffer
	b.spawner = launch.NewSpawner("/nonexistent/corral-init", slog.New(slog.NewTextHandler(&logs, nil)))
	if b.spawner.Pid() != 0 {
		t.Fatal("a spawner from a missing binary is running")
	}
	if !strings.Contains(logs.String(), "spawned from the daemon") {
		t.Errorf("no log line for the fallback: %q", logs.String())
	}
	s := newSandbox(t, b, nil)
	if r := sh(t, s, "echo ok"); r.stdout != "ok\n" {
		t.Fatalf("exec: %+v", r)
	}
	if got := parentPid(t, s.(*sandbox).proc.Pid); got != os.Getpid() {
		t.Errorf("init's parent is %d, want the daemon %d", got, os.Getpid())
	}
}
