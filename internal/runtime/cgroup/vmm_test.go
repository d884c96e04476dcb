package cgroup

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestVMMGroup: Ensure makes a group and finds it again, AddProc moves a
// process in, SetCPU writes a quota and lifts it, and Remove, once the
// process is gone, leaves no directory.
func TestVMMGroup(t *testing.T) {
	m := testManager(t)
	if g := m.Group("vmm"); g.unified && !m.h.V2Controllers["cpu"] || !g.unified && g.v1["cpu"] == "" {
		t.Skip("no cpu controller")
	}
	g, err := m.Ensure("vmm")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Ensure("vmm"); err != nil {
		t.Fatalf("Ensure of an existing group: %v", err)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if pids, err := g.Procs(); err != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Errorf("procs after AddProc(%d): %v %v", cmd.Process.Pid, pids, err)
	}
	quota := func() string {
		f := filepath.Join(g.v1["cpu"], "cpu.cfs_quota_us")
		if g.unified {
			f = filepath.Join(g.v2, "cpu.max")
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(string(b))[0]
	}
	if err := g.SetCPU(250); err != nil {
		t.Fatal(err)
	}
	if got := quota(); got != strconv.Itoa(250*cpuPeriodUS/1000) {
		t.Errorf("quota for 250m: %s", got)
	}
	if err := g.SetCPU(0); err != nil {
		t.Fatal(err)
	}
	if got := quota(); got != "-1" && got != "max" {
		t.Errorf("quota lifted: %s", got)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := g.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	if g.Exists() {
		t.Error("group left after Remove")
	}
}
