package qemu

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
)

// TestSweepRemovesVMMGroup: a VMM joined to its group shows in List; a
// sweep of a daemon that knows no sandbox cleans up the id: the VMM its
// record names is killed (it is found by no command line), then the
// group, the empty parent and the run dir go.
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
	vmm := startVMM(t)
	const id = "sbx1"
	if err := g.Join(id, vmm.Pid, 250); err != nil {
		t.Fatal(err)
	}
	if ids, err := g.List(); err != nil || !slices.Contains(ids, id) {
		t.Fatalf("groups after Join: %v %v", ids, err)
	}
	r := &RunDir{Path: t.TempDir(), IsVMM: IsQEMU, Groups: g, Log: slog.Default()}
	if err := os.Mkdir(r.Dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	var rec VMM
	rec.Started(vmm)
	if err := SaveMachine(r.Dir(id), rec); err != nil {
		t.Fatal(err)
	}
	var loaded VMM
	if err := r.Load(id, &loaded); err != nil || loaded != rec {
		t.Errorf("load: %+v %v, want %+v", loaded, err, rec)
	}
	if err := r.Load("../"+id, &loaded); !errdefs.IsInvalidArgument(err) {
		t.Errorf("load of a path for an id: %v, want InvalidArgument", err)
	}
	if left, err := r.Leftovers(id); err != nil || !slices.Equal(left, []string{"VMM cgroup", "run dir"}) {
		t.Errorf("leftovers before the sweep: %v %v", left, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Sweep(ctx, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if vmm.Alive() {
		t.Error("the recorded VMM outlived the sweep")
	}
	if err := r.Load(id, &loaded); !errdefs.IsNotFound(err) {
		t.Errorf("load after the sweep: %v, want NotFound", err)
	}
	if left, err := r.Leftovers(id); err != nil || len(left) != 0 {
		t.Errorf("leftovers after the sweep: %v %v", left, err)
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
