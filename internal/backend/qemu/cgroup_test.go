package qemu

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/runtime/cgroup"
)

// TestSweepRemovesVMMGroup: a VMM joined to its group shows in List; a
// sweep of a daemon that knows no sandbox cleans up an id that has only
// a group left (no run dir, no VMM found by command line), and Remove
// takes the group and then the empty parent.
func TestSweepRemovesVMMGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (creates cgroups)")
	}
	if _, err := cgroup.Detect(); err != nil {
		t.Skipf("no cgroups: %v", err)
	}
	parent := fmt.Sprintf("corral-qemu-test%d", os.Getpid())
	g, err := NewCPUGroups(parent, "microvm")
	if err != nil {
		t.Fatal(err)
	}
	vmm := exec.Command("sleep", "60")
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = vmm.Process.Kill(); _ = vmm.Wait() }()
	const id = "sbx1"
	if err := g.Join(id, vmm.Process.Pid, 250); err != nil {
		t.Fatal(err)
	}
	if ids, err := g.List(); err != nil || !slices.Contains(ids, id) {
		t.Fatalf("groups after Join: %v %v", ids, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runDir := t.TempDir()
	var swept []string
	err = Sweep(ctx, slog.Default(), runDir, nil, g, func(string) bool { return false }, func(ctx context.Context, id string) error {
		swept = append(swept, id)
		_ = vmm.Process.Kill() // what Remove does to a VMM it finds
		_ = vmm.Wait()
		return Remove(ctx, id, filepath.Join(runDir, id), 0, 0, nil, nil, nil, g)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(swept, []string{id}) {
		t.Errorf("swept %v; want [%s]", swept, id)
	}
	if ids, err := g.List(); err != nil || len(ids) != 0 {
		t.Errorf("groups after the sweep: %v %v", ids, err)
	}
	if left, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent + "-microvm*"); len(left) > 0 {
		t.Errorf("left after the last group went: %v", left)
	}
}

// TestNoCgroupParent: without a parent nothing is enforced or made.
func TestNoCgroupParent(t *testing.T) {
	g, err := NewCPUGroups("", "vm")
	if err != nil || g != nil {
		t.Fatalf("NewCPUGroups without a parent: %v %v", g, err)
	}
	if err := g.Enforces(); err == nil {
		t.Error("Enforces without a parent: nil")
	}
	if err := g.Join("x", os.Getpid(), 100); err != nil {
		t.Errorf("Join without groups: %v", err)
	}
}
