package cgroup

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/runtime/osthread"
	"golang.org/x/sys/unix"
)

// TestFlatCPU: on a v1 cpu hierarchy a sandbox's cpu cgroup sits at the
// top as parent@id, with its quota, while the other controllers stay under
// the parent; List finds it; a thread placed there goes back to where it
// came from; Remove leaves nothing. Best-effort sandboxes stay nested
// under their SCHED_IDLE parent.
func TestFlatCPU(t *testing.T) {
	m := testManager(t)
	if m.h.V1["cpu"] == "" {
		t.Skip("no v1 cpu hierarchy: pure v2 keeps the nested layout")
	}
	id := "sb.flat"
	g, err := m.Create(id, Limits{CPUMillis: 500, Pids: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Remove(t.Context()) })
	cpuDir := filepath.Join(m.h.V1["cpu"], m.parent+FlatCPUSep+id)
	if g.v1["cpu"] != cpuDir {
		t.Fatalf("cpu dir %s, want %s", g.v1["cpu"], cpuDir)
	}
	if b, err := os.ReadFile(filepath.Join(cpuDir, "cpu.cfs_quota_us")); err != nil || strings.TrimSpace(string(b)) != "50000" {
		t.Errorf("quota %q %v, want 50000", b, err)
	}
	if p := m.h.V1["pids"]; p != "" && p != m.h.V1["cpu"] && g.v1["pids"] != filepath.Join(p, m.parent, id) {
		t.Errorf("pids dir %s, want it under the parent", g.v1["pids"])
	}
	if ids, err := m.List(); err != nil || !slices.Contains(ids, id) {
		t.Errorf("List = %v %v, want %s in it", ids, err, id)
	}

	// The thread is never unlocked: it exits with the goroutine and leaves
	// the group, which Remove then waits for.
	done := make(chan error)
	osthread.Go(func() {
		if err := g.EnterThread(); err != nil {
			done <- err
			return
		}
		tasks, _ := os.ReadFile(filepath.Join(cpuDir, "tasks"))
		if !slices.Contains(strings.Fields(string(tasks)), strconv.Itoa(unix.Gettid())) {
			done <- &os.PathError{Op: "enter", Path: cpuDir, Err: os.ErrInvalid}
			return
		}
		done <- nil
	})
	if err := <-done; err != nil {
		t.Fatalf("thread into %s: %v", cpuDir, err)
	}
	if err := g.Remove(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cpuDir); !os.IsNotExist(err) {
		t.Errorf("%s after Remove: %v", cpuDir, err)
	}

	idle := m.Idle()
	t.Cleanup(func() { _ = idle.RemoveParent() })
	if err := idle.ensureParent(); err != nil {
		t.Skipf("best-effort parent: %v", err)
	}
	if d := idle.Group(id).v1["cpu"]; d != filepath.Join(m.h.V1["cpu"], m.parent+IdleSuffix, id) {
		t.Errorf("best-effort cpu dir %s, want it under the idle parent", d)
	}
}

func TestParentRejectsFlatSep(t *testing.T) {
	if _, err := NewManager("corral" + FlatCPUSep + "x"); err == nil || !strings.Contains(err.Error(), FlatCPUSep) {
		t.Errorf("NewManager(corral@x) = %v, want an error naming %q", err, FlatCPUSep)
	}
}
