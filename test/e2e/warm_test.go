package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

// sandboxCgroups lists the sandbox cgroups under parent (pids hierarchy).
func sandboxCgroups(parent string) []string {
	ents, _ := os.ReadDir("/sys/fs/cgroup/pids/" + parent)
	var ids []string
	for _, e := range ents {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	sort.Strings(ids)
	return ids
}

// loopsUnder lists the loop devices whose backing file is under dir.
func loopsUnder(dir string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), dir) {
			out = append(out, strings.TrimSpace(string(b)))
		}
	}
	return out
}

func waitUntil(t *testing.T, what string, limit time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWarmPoolAndBackgroundDeletesAcrossACrash: default creates take
// pooled sandboxes (labels assigned at hand-out), other creates make their
// own; the daemon is killed with pooled sandboxes and deletes in flight,
// and after the restart nothing is left that no record names: no cgroup,
// process, loop device or mount.
func TestWarmPoolAndBackgroundDeletesAcrossACrash(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	c := d.start("--warm-pool", "3")
	waitUntil(t, "3 pooled sandboxes", 2*time.Minute, func() bool { return len(sandboxCgroups(d.parent)) == 3 })
	if l, err := c.List(ctx, client.ListOptions{}); err != nil || len(l) != 0 {
		t.Fatalf("pooled sandboxes are listed: %v %v", l, err)
	}
	pooled := sandboxCgroups(d.parent)

	kept, err := c.Create(ctx, client.CreateOptions{Labels: map[string]string{"role": "kept"}, Env: map[string]string{"A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pooled, kept.ID()) {
		t.Errorf("a default create made %s instead of taking one of %v", kept.ID(), pooled)
	}
	if out := testenv.Sh(t, kept, "echo $A; echo x > /tmp/f; cat /tmp/f"); out != "1\nx\n" {
		t.Errorf("pooled sandbox: %q", out)
	}
	if info, err := c.Get(ctx, kept.ID()); err != nil || info.Labels["role"] != "kept" {
		t.Errorf("labels of a pooled sandbox: %+v %v", info, err)
	}
	big, err := c.Create(ctx, client.CreateOptions{Resources: client.Resources{MemoryBytes: 300 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(pooled, big.ID()) {
		t.Errorf("a create with its own memory limit took pooled sandbox %s", big.ID())
	}

	var victims []*client.Sandbox
	for range 4 {
		sb, err := c.Create(ctx, client.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		victims = append(victims, sb)
	}
	// One delete has answered (its teardown may still run), the others
	// are in flight when the daemon dies.
	if err := victims[0].Delete(ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, sb := range victims[1:] {
		wg.Add(1)
		go func() { defer wg.Done(); _ = sb.Delete(ctx) }()
	}
	time.Sleep(5 * time.Millisecond)
	d.stop(syscall.SIGKILL)
	wg.Wait()

	c = d.start("--warm-pool", "0")
	left := []string{kept.ID(), big.ID()}
	for _, sb := range victims[1:] {
		info, err := c.Get(ctx, sb.ID())
		switch {
		case err == nil && info.State == client.StateRunning:
			left = append(left, sb.ID()) // its delete never reached the node
		case err == nil && info.State == client.StateStopped:
			// Killed before its record said deleting: lost, cleaned up.
		case !client.IsNotFound(err):
			t.Errorf("get %s after the crash: %v", sb.ID(), err)
		}
	}
	if _, err := c.Get(ctx, victims[0].ID()); !client.IsNotFound(err) {
		t.Errorf("a deleted sandbox after the restart: %v", err)
	}
	sort.Strings(left)
	if got := sandboxCgroups(d.parent); !slices.Equal(got, left) {
		t.Errorf("cgroups after the restart: %v, want the recorded sandboxes %v", got, left)
	}
	if loops := loopsUnder(d.dataDir); len(loops) != len(left) {
		t.Errorf("loop devices after the restart: %v, want one for each of %v", loops, left)
	}
	for _, pid := range testenv.SandboxProcesses(d.parent) {
		cg, _ := os.ReadFile("/proc/" + pid + "/cgroup")
		if !slices.ContainsFunc(left, func(id string) bool { return strings.Contains(string(cg), "/"+id+"\n") }) {
			t.Errorf("process %s in no recorded sandbox: %s", pid, cg)
		}
	}
	if out := testenv.Sh(t, kept, "cat /tmp/f"); out != "x\n" {
		t.Errorf("kept sandbox after the restart: %q", out)
	}

	d.stop(syscall.SIGTERM)
	d.start("--cleanup-on-exit", "--warm-pool", "2")
	waitUntil(t, "2 pooled sandboxes", 2*time.Minute, func() bool { return len(sandboxCgroups(d.parent)) == len(left)+2 })
	d.stop(syscall.SIGTERM)
	testenv.AssertNoLeaks(t, d.dataDir, d.parent)
	if loops := loopsUnder(d.dataDir); len(loops) != 0 {
		t.Errorf("loop devices left: %v", loops)
	}
	testenv.RemoveCgroupParent(d.parent)
}
