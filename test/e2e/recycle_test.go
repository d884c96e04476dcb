package e2e

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

// counter reads one sample of the daemon's /metrics (0 when it has none
// yet).
func counter(t *testing.T, d *daemon, sample string) int {
	t.Helper()
	body := metricsAt(t, filepath.Join(d.dataDir, "corral.sock"))
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\d+)$`).FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

const (
	pooledRecycles   = `corral_sandbox_recycles_total{outcome="pooled"}`
	recycledHandouts = `corral_warm_pool_handouts_total{source="recycled"}`
)

// TestRecycledSandboxes: on a node started with --recycle, a deleted
// default sandbox is scrubbed and handed to the next default create under
// a new id, with nothing of the last tenant left: its files (a fresh disk),
// its processes, what it left in /dev/shm; the node's shell and file API
// work there. Across a kill -9 of the daemon a handed-out recycled sandbox
// is re-attached and a pooled one swept, and at the end nothing leaks.
func TestRecycledSandboxes(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	args := []string{"--warm-pool", "0", "--recycle", "4"}
	c := d.start(args...)
	first, err := c.Create(ctx, client.CreateOptions{Labels: map[string]string{"episode": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Sh(t, first, "echo answer > /root/secret; echo z > /dev/shm/z; setsid sleep 1000 >/dev/null 2>&1 < /dev/null &")
	cgroups := sandboxCgroups(d.parent)
	if err := first.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the deleted sandbox pooled", time.Minute, func() bool { return counter(t, d, pooledRecycles) == 1 })
	if got := sandboxCgroups(d.parent); !slices.Equal(got, cgroups) {
		t.Fatalf("cgroups after a recycling delete: %v, want the same sandbox's %v", got, cgroups)
	}
	if _, err := c.Get(ctx, first.ID()); !client.IsNotFound(err) {
		t.Fatalf("the deleted sandbox is still there: %v", err)
	}

	second, err := c.Create(ctx, client.CreateOptions{Labels: map[string]string{"episode": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	if counter(t, d, recycledHandouts) != 1 || second.ID() == first.ID() {
		t.Fatalf("the next create did not take the recycled sandbox under a new id: %s after %s, %d hand-outs",
			second.ID(), first.ID(), counter(t, d, recycledHandouts))
	}
	out := testenv.Sh(t, second, "cat /root/secret /dev/shm/z 2>&1; ps -o comm | grep -c sleep; echo $0; hostname")
	if strings.Contains(out, "answer") || !strings.HasSuffix(out, "\n0\n/.corral/sh\nsandbox\n") {
		t.Fatalf("the next tenant sees the last one's: %q", out)
	}
	if err := second.Files().Write(ctx, "/root/api", []byte("via the file API\n")); err != nil {
		t.Fatal(err)
	}
	if out := testenv.Sh(t, second, "cat /root/api"); out != "via the file API\n" {
		t.Fatalf("file API on a recycled sandbox: %q", out)
	}
	if info, err := c.Get(ctx, second.ID()); err != nil || info.Labels["episode"] != "2" {
		t.Fatalf("labels of a recycled sandbox: %+v %v", info, err)
	}

	// One more deleted and pooled, then the daemon dies.
	third, err := c.Create(ctx, client.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := third.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the third sandbox pooled", time.Minute, func() bool { return counter(t, d, pooledRecycles) == 2 })
	d.stop(syscall.SIGKILL)
	c = d.start(args...)
	if info, err := c.Get(ctx, second.ID()); err != nil || info.State != client.StateRunning {
		t.Fatalf("recycled sandbox after the restart: %+v %v", info, err)
	}
	if out := testenv.Sh(t, second, "cat /root/api"); out != "via the file API\n" {
		t.Fatalf("recycled sandbox after the restart: %q", out)
	}
	if got := sandboxCgroups(d.parent); len(got) != 1 {
		t.Fatalf("cgroups after the restart: %v, want the recycled sandbox in use alone (the pooled one swept)", got)
	}
	if err := second.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the recovered sandbox pooled", time.Minute, func() bool { return counter(t, d, pooledRecycles) == 1 })
	d.stop(syscall.SIGTERM)
	d.start(append(args, "--cleanup-on-exit")...)
	d.stop(syscall.SIGTERM)
	testenv.AssertNoLeaks(t, d.dataDir, d.parent)
	if loops := loopsUnder(d.dataDir); len(loops) != 0 {
		t.Errorf("loop devices left: %v", loops)
	}
	testenv.RemoveCgroupParent(d.parent)
}

// TestRecycledSandboxKeepsItsResources: on a recycling node a deleted
// sandbox with resources of its own goes to the next create of its
// project that asks for the same resources, with the limits it was made
// with, and to no create that asks for others or to be fresh.
func TestRecycledSandboxKeepsItsResources(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	c := d.start("--warm-pool", "0", "--recycle", "4")
	own := client.CreateOptions{Resources: client.Resources{MemoryBytes: 96 << 20, Pids: 64}}
	first, err := c.Create(ctx, own)
	if err != nil {
		t.Fatal(err)
	}
	cgroups := sandboxCgroups(d.parent)
	if len(cgroups) != 1 {
		t.Fatalf("cgroups with one sandbox: %v", cgroups)
	}
	pidsMax := "/sys/fs/cgroup/pids/" + d.parent + "/" + cgroups[0] + "/pids.max"
	if err := first.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the deleted sandbox pooled", time.Minute, func() bool { return counter(t, d, pooledRecycles) == 1 })

	// A fresh create neither takes it nor is recycled by its delete.
	fresh := own
	fresh.Fresh = true
	sb, err := c.Create(ctx, fresh)
	if err != nil {
		t.Fatal(err)
	}
	if n := counter(t, d, recycledHandouts); n != 0 {
		t.Fatalf("a fresh create took a recycled sandbox (%d hand-outs)", n)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the fresh sandbox torn down", time.Minute, func() bool { return len(sandboxCgroups(d.parent)) == 1 })
	if n := counter(t, d, pooledRecycles); n != 1 {
		t.Fatalf("a fresh sandbox's delete pooled it (%d pooled)", n)
	}

	other, err := c.Create(ctx, client.CreateOptions{Resources: client.Resources{MemoryBytes: 128 << 20, Pids: 64}})
	if err != nil {
		t.Fatal(err)
	}
	if n := counter(t, d, recycledHandouts); n != 0 {
		t.Fatalf("a create asking for another memory limit took a recycled sandbox (%d hand-outs)", n)
	}
	second, err := c.Create(ctx, own)
	if err != nil {
		t.Fatal(err)
	}
	if n := counter(t, d, recycledHandouts); n != 1 {
		t.Fatalf("a create asking for the same resources did not take the recycled sandbox (%d hand-outs)", n)
	}
	if b, err := os.ReadFile(pidsMax); err != nil || strings.TrimSpace(string(b)) != "64" {
		t.Fatalf("the recycled sandbox's pids.max: %q %v, want 64", b, err)
	}
	if out := testenv.Sh(t, second, "echo ok"); out != "ok\n" {
		t.Fatalf("the recycled sandbox: %q", out)
	}
	for _, sb := range []*client.Sandbox{other, second} {
		if err := sb.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "both sandboxes pooled", time.Minute, func() bool { return counter(t, d, pooledRecycles) == 3 })
	d.stop(syscall.SIGTERM)
	d.start("--warm-pool", "0", "--recycle", "4", "--cleanup-on-exit")
	d.stopLeavingNothing()
}

// TestRecyclingNodeKeepsTheNewest: a full pool lets its least recently
// pooled recycled sandbox go for a newly deleted one, so a node whose job
// moves to sandboxes of other resources recycles those.
func TestRecyclingNodeKeepsTheNewest(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	args := []string{"--warm-pool", "0", "--recycle", "1"}
	c := d.start(args...)
	first := client.CreateOptions{Resources: client.Resources{MemoryBytes: 96 << 20}}
	next := client.CreateOptions{Resources: client.Resources{MemoryBytes: 112 << 20}}
	for i, o := range []client.CreateOptions{first, next} {
		sb, err := c.Create(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if err := sb.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the deleted sandbox pooled", time.Minute, func() bool { return counter(t, d, pooledRecycles) == i+1 })
	}
	waitUntil(t, "the older pooled sandbox gone", time.Minute, func() bool { return len(sandboxCgroups(d.parent)) == 1 })
	if n := counter(t, d, `corral_sandbox_recycles_total{outcome="evicted"}`); n != 1 {
		t.Fatalf("%d evictions counted, want 1", n)
	}
	var made []*client.Sandbox
	for i, o := range []client.CreateOptions{first, next} {
		sb, err := c.Create(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, sb)
		if n := counter(t, d, recycledHandouts); n != i {
			t.Fatalf("create %d: %d recycled hand-outs, want %d (only the newest deleted sandbox kept)", i+1, n, i)
		}
	}
	for _, sb := range made {
		if err := sb.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d.stop(syscall.SIGTERM)
	d.start(append(args, "--cleanup-on-exit")...)
	d.stopLeavingNothing()
}

// TestStubNodeRecyclesAFew: on a node started with --init-stub, --recycle
// N also bounds each image's recyclable sandboxes (corral-init as PID 1),
// in use or pooled: creates beyond make stub sandboxes, which a delete
// tears down, and a create of another class takes the place of a pooled
// recycled sandbox it cannot use.
func TestStubNodeRecyclesAFew(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	args := []string{"--init-stub", "--warm-pool", "0", "--recycle", "2"}
	c := d.start(args...)
	create := func(o client.CreateOptions) *client.Sandbox {
		t.Helper()
		sb, err := c.Create(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	// pid1 names what runs in a sandbox made from scratch (its cgroup is
	// its id): corral-init, or the stub alone while it is idle.
	pid1 := func(sb *client.Sandbox) string {
		t.Helper()
		var comms []string
		for _, pid := range cgroupPids(d.parent, sb.ID()) {
			b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
			if err == nil {
				comms = append(comms, strings.TrimSpace(string(b)))
			}
		}
		if len(comms) != 1 {
			t.Fatalf("processes of idle sandbox %s: %v, want its init alone", sb.ID(), comms)
		}
		return comms[0]
	}
	deleteAll := func(sbs ...*client.Sandbox) {
		t.Helper()
		for _, sb := range sbs {
			if err := sb.Delete(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	made := []*client.Sandbox{create(client.CreateOptions{}), create(client.CreateOptions{}), create(client.CreateOptions{})}
	for i, want := range []string{"corral-init", "corral-init", "corral-initstub"} {
		if got := pid1(made[i]); got != want {
			t.Fatalf("sandbox %d of 3 with --recycle 2 runs %s, want %s", i+1, got, want)
		}
		if out := testenv.Sh(t, made[i], "echo ok"); out != "ok\n" {
			t.Fatalf("sandbox %d: %q", i+1, out)
		}
	}
	// A restart counts the recyclable sandboxes it re-attaches.
	d.stop(syscall.SIGKILL)
	c = d.start(args...)
	made = append(made, create(client.CreateOptions{}))
	if got := pid1(made[3]); got != "corral-initstub" {
		t.Fatalf("a create after a restart that re-attached two recyclable sandboxes runs %s, want the stub", got)
	}
	deleteAll(made...)
	waitUntil(t, "two pooled, the stub sandboxes torn down", time.Minute, func() bool {
		return counter(t, d, pooledRecycles) == 2 && len(sandboxCgroups(d.parent)) == 2
	})

	again := []*client.Sandbox{create(client.CreateOptions{}), create(client.CreateOptions{})}
	if n := counter(t, d, recycledHandouts); n != 2 {
		t.Fatalf("%d recycled hand-outs to the next two creates, want 2", n)
	}
	third := create(client.CreateOptions{})
	if got := pid1(third); got != "corral-initstub" {
		t.Fatalf("a create with two recyclable sandboxes in use runs %s, want the stub", got)
	}
	deleteAll(again[0])
	waitUntil(t, "the deleted sandbox pooled", time.Minute, func() bool { return counter(t, d, pooledRecycles) == 3 })
	// One in use and one pooled: a create of another class (its own
	// memory limit) cannot take the pooled one, so that one goes for it.
	other := create(client.CreateOptions{Resources: client.Resources{MemoryBytes: 96 << 20}})
	if got := pid1(other); got != "corral-init" {
		t.Fatalf("a create of another class runs %s, want a recyclable sandbox in place of the pooled one", got)
	}
	if n := counter(t, d, `corral_sandbox_recycles_total{outcome="evicted"}`); n != 1 {
		t.Fatalf("%d evictions counted, want 1", n)
	}
	deleteAll(again[1], third, other)
	d.stop(syscall.SIGTERM)
	d.start(append(args, "--cleanup-on-exit")...)
	d.stopLeavingNothing()
}
