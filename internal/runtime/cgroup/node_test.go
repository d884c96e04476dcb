package cgroup

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestEnterNode: the process and a helper it starts afterwards run in the
// node cgroup with the node's CPU weight; the sandboxes' parents are the
// first reclaimed (v1); Release moves the process back and keeps the
// directory only while a helper is still in it.
func TestEnterNode(t *testing.T) {
	m := testManager(t)
	name := m.parent + "-node"
	before, err := readCgroups("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	ng, err := m.EnterNode(name, []string{m.parent}, NodeReserve{MemoryLow: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ng.Release(); _ = os.Remove(filepath.Join(m.h.V1["memory"], m.parent)) })
	ctrl, weightFile, want := "cpu", "cpu.shares", strconv.Itoa(NodeCPUSharesV1)
	if m.h.Unified() {
		ctrl, weightFile, want = "", "cpu.weight", strconv.Itoa(NodeCPUWeightV2)
	}
	now, _ := readCgroups("/proc/self/cgroup")
	if now[ctrl] != "/"+name {
		t.Fatalf("in %q after EnterNode, want /%s", now[ctrl], name)
	}
	dir := ng.Dirs()[0]
	if b, err := os.ReadFile(filepath.Join(dir, weightFile)); err != nil || strings.TrimSpace(string(b)) != want {
		t.Errorf("%s = %q %v, want %s", weightFile, b, err, want)
	}
	if !m.h.Unified() {
		b, err := os.ReadFile(filepath.Join(m.h.V1["memory"], m.parent, "memory.soft_limit_in_bytes"))
		if err != nil || strings.TrimSpace(string(b)) != "0" {
			t.Errorf("sandbox parent soft limit = %q %v, want 0", b, err)
		}
	}
	helper := exec.Command("sleep", "60")
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	hc, _ := readCgroups("/proc/" + strconv.Itoa(helper.Process.Pid) + "/cgroup")
	if hc[ctrl] != "/"+name {
		t.Errorf("helper in %q, want /%s", hc[ctrl], name)
	}
	if err := ng.Release(); err != nil {
		t.Fatal(err)
	}
	now, _ = readCgroups("/proc/self/cgroup")
	if now[ctrl] != before[ctrl] {
		t.Errorf("in %q after Release, want %q", now[ctrl], before[ctrl])
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("node cgroup removed while the helper is in it: %v", err)
	}
	_ = helper.Process.Kill()
	_ = helper.Wait()
	// The next start joins the kept directory; its release removes it.
	ng, err = m.EnterNode(name, []string{m.parent}, NodeReserve{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ng.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("node cgroup left after the last release: %v", err)
	}
}
