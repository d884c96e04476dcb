package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/netpolicy/netlab"
	"github.com/corral-dev/corral/internal/node"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestMicroVMNetworkedFork: forks of a microVM with an allowlist on the lab
// internet each get a network identity of their own (MAC and IPv4 address,
// distinct from each other and from the parent's), keep the parent's
// policy (the allowed host answers, a denied one does not), and the parent
// keeps its identity and its network. The node's snapshot limit refuses a
// snapshot (and a fork) over it. One boot; the forks are restores.
func TestMicroVMNetworkedFork(t *testing.T) {
	if _, err := os.Stat("/usr/bin/qemu-system-x86_64"); err != nil {
		t.Skip("microvm: needs qemu-system-x86_64 (package qemu-system-x86)")
	}
	if ks, _ := filepath.Glob("/boot/vmlinuz-*"); len(ks) == 0 {
		t.Skip("microvm: needs a guest kernel (package linux-image-amd64)")
	}
	lab := testenv.NetLab(t)
	srv := testenv.StartServer(t, testenv.WithAgent(t), func(c *server.Config) {
		c.Network = testenv.LabNetwork(lab, "cf", map[string][]string{"pypi": {"pypi.test:80"}})
		c.Snapshots = node.SnapshotLimits{Count: 1}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	parent := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: "microvm",
		Resources: client.Resources{MemoryBytes: 256 << 20, CPUMillis: 1000},
		Network:   client.Network{Mode: client.NetworkAllowlist, Allow: []string{"pypi"}}})
	testenv.StartCounter(t, parent)
	// identity is the guest's MAC and IPv4 address/prefix on eth0.
	const identity = `cat /sys/class/net/eth0/address; ip -4 -o addr show dev eth0 | awk '{print $4}'`
	reaches := func(name string, sb *client.Sandbox) {
		t.Helper()
		if out := testenv.Sh(t, sb, "nslookup pypi.test >/dev/null && "+httpGet(netlab.PyPI4)); !strings.Contains(out, "lab host "+netlab.PyPI4.String()) {
			t.Errorf("%s: allowed host from the guest: %q", name, out)
		}
		// A dropped packet: the guest's connect times out.
		res := testenv.Run(t, sb, client.Command{Shell: "timeout 6 " + httpGet(netlab.NPM4), Timeout: time.Minute})
		if strings.Contains(string(res.Stdout), "lab host") {
			t.Errorf("%s: denied host reached: %q", name, res.Stdout)
		}
	}
	parentID := testenv.Sh(t, parent, identity)
	reaches("parent before the fork", parent)

	// The node keeps one snapshot (--max-snapshots 1): a second, and a
	// fork (which needs one), are refused before anything is written.
	snap, err := parent.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parent.Snapshot(ctx); !client.IsResourceExhausted(err) || !strings.Contains(err.Error(), "at most 1 (--max-snapshots) and holds 1") {
		t.Errorf("snapshot over the limit: %v, want resource exhausted naming the limit and the use", err)
	}
	if _, err := parent.Fork(ctx, 2); !client.IsResourceExhausted(err) {
		t.Errorf("fork over the snapshot limit: %v, want resource exhausted", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(srv.Config.DataDir, "snapshots")); len(ents) != 1 {
		t.Errorf("snapshot dirs after the refusals: %v, want only %s", ents, snap.ID)
	}
	if all, _ := srv.Client.List(ctx, client.ListOptions{}); len(all) != 1 {
		t.Errorf("%d sandboxes after a refused fork, want 1", len(all))
	}
	if err := srv.Client.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	res, err := parent.Fork(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("networked fork × 2: %v", time.Since(start))
	if !res.ProcessesCarried || len(res.Forks) != 2 {
		t.Fatalf("fork result: %+v", res)
	}
	seen := map[string]string{}
	for _, line := range strings.Fields(parentID) {
		seen[line] = "the parent"
	}
	forkAt := testenv.ReadCounter(t, parent)
	for i, f := range res.Forks {
		if f.Err != nil {
			t.Fatalf("fork %d: %v", i, f.Err)
		}
		name := "fork " + string(rune('0'+i))
		if f.Info.Network.Mode != client.NetworkAllowlist || strings.Join(f.Info.Network.Allow, ",") != "pypi" {
			t.Errorf("%s: network policy %+v, want the parent's allowlist", name, f.Info.Network)
		}
		id := testenv.Sh(t, f.Sandbox, identity)
		fields := strings.Fields(id)
		if len(fields) != 2 {
			t.Fatalf("%s: identity %q, want a MAC and an address", name, id)
		}
		for _, v := range fields {
			if other, dup := seen[v]; dup {
				t.Errorf("%s has %s, as %s does", name, v, other)
			}
			seen[v] = name
		}
		t.Logf("%s: %s", name, strings.Join(fields, " "))
		reaches(name, f.Sandbox)
		testenv.AssertCounting(t, name, f.Sandbox, 1)
	}
	if got := testenv.Sh(t, parent, identity); got != parentID {
		t.Errorf("parent's identity after the fork: %q, was %q", got, parentID)
	}
	reaches("parent after the fork", parent)
	testenv.AssertCounting(t, "the parent after its forks", parent, forkAt)
}
