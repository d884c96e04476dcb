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
	if got := parentPid(t, s.(*sandbox).proc.Pid); got != sp {
		t.Errorf("init's parent is %d, want the spawner %d (the test process is %d)", got, sp, os.Getpid())
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
