package microvm

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/netpolicy/netlab"
)

// newLab returns a lab internet and a network config using it.
func newLab(t *testing.T) (*netlab.Lab, netpolicy.Config) {
	t.Helper()
	skipUnlessRoot(t)
	lab, err := netlab.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	return lab, netpolicy.Config{
		Bridge:    fmt.Sprintf("cv%x", time.Now().UnixNano()&0xffffffff),
		NodeNetns: lab.NodePath,
		Upstreams: []string{netip.AddrPortFrom(netlab.DNS4, 53).String()},
		Presets:   map[string][]string{"pypi": {"pypi.test:80"}},
		PoolSize:  1,
	}
}

func newManager(t *testing.T, cfg netpolicy.Config) *netpolicy.Manager {
	t.Helper()
	m, err := netpolicy.NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close manager: %v", err)
		}
	})
	return m
}

// TestNetworkAllowlist boots one networked microVM on a lab internet and
// checks from inside the guest that the tc program on its veth enforces
// the policy the cgroup programs enforce for containers: the allowed name
// resolves and answers over IPv4 and IPv6, a denied name is refused by the
// DNS proxy, a denied address and the upstream DNS server are unreachable
// (dropped: a timeout in the guest), refusals are counted, and deleting
// the sandbox leaves no veth behind.
func TestNetworkAllowlist(t *testing.T) {
	lab, cfg := newLab(t)
	m := newManager(t, cfg)
	b := newBackend(t, func(c *Config) { c.Network = m })
	spec := testSpec(t)
	spec.Network = backend.Network{Mode: "allowlist", Allow: []string{"pypi"}}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	sbx, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	vm := sbx.(*sandbox)
	hostVeth := vm.m.Net.HostVeth
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = sbx.Stop(context.Background())
			_ = b.Cleanup(context.Background(), spec.ID, nil)
		}
	})

	// Each step prints a verdict line; commands that must fail are
	// bounded by busybox timeout so that a dropped packet costs seconds.
	script := `
nslookup pypi.test >/tmp/ns.out 2>&1 && echo "dns-allowed ok" || echo "dns-allowed fail"
grep -q 198.18.1.10 /tmp/ns.out && echo "dns-answer ok" || echo "dns-answer missing"
printf 'GET / HTTP/1.0\r\n\r\n' | timeout 20 nc 198.18.1.10 80 | tail -n1
printf 'GET / HTTP/1.0\r\n\r\n' | timeout 20 nc 2001:db8:1::10 80 | tail -n1
timeout 15 nslookup denied.test >/tmp/den.out 2>&1; grep -q 198.18.1.30 /tmp/den.out && echo "dns-denied answered" || echo "dns-denied refused"
printf 'GET / HTTP/1.0\r\n\r\n' | timeout 6 nc 198.18.1.30 80 | grep -q lab && echo "denied-ip reached" || echo "denied-ip unreachable"
printf 'GET / HTTP/1.0\r\n\r\n' | timeout 6 nc 2001:db8:1::30 80 | grep -q lab && echo "denied-ip6 reached" || echo "denied-ip6 unreachable"
timeout 8 nslookup pypi.test 198.18.1.53 >/tmp/up.out 2>&1; grep -q 198.18.1.10 /tmp/up.out && echo "upstream reached" || echo "upstream blocked"
`
	out := sh(t, sbx, script)
	t.Logf("guest:\n%s", out)
	for _, want := range []string{"dns-allowed ok", "dns-answer ok", "lab host 198.18.1.10", "lab host 2001:db8:1::10",
		"dns-denied refused", "denied-ip unreachable", "denied-ip6 unreachable", "upstream blocked"} {
		if !strings.Contains(out, want) {
			t.Errorf("guest output lacks %q", want)
		}
	}

	st, err := vm.NetworkStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	t.Logf("stats: total %d, %+v", st.Total, st.Refusals)
	for _, r := range st.Refusals {
		seen[r.Hook+" "+r.Address+r.Name] = true
		// The guest's own chatter (ARP, neighbour discovery, MLD) must
		// pass the identity checks, and the namespace's must not count.
		if r.Hook == "spoof" {
			t.Errorf("a frame was counted as the guest's forgery: %+v", r)
		}
	}
	for _, want := range []string{"tap 198.18.1.30", "tap 2001:db8:1::30", "tap 198.18.1.53", "dns denied.test"} {
		if !seen[want] {
			t.Errorf("refusals lack %q", want)
		}
	}
	if st.Total < 3 {
		t.Errorf("total refusals %d, want at least 3", st.Total)
	}

	if err := sbx.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Cleanup(ctx, spec.ID, nil); err != nil {
		t.Fatal(err)
	}
	deleted = true
	h, err := netlink.NewHandleAt(netns.NsHandle(int(lab.Node.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.LinkByName(hostVeth); err == nil {
		t.Errorf("veth %s still exists after delete", hostVeth)
	}
}

// TestNetworkSurvivesDaemonRestart: a new backend and network manager (a
// restarted daemon) recover a running networked VM: its QEMU kept the
// namespace, the tc program kept enforcing, and the recovered sandbox
// reads the same counters and serves DNS again.
func TestNetworkSurvivesDaemonRestart(t *testing.T) {
	_, cfg := newLab(t)
	m1, err := netpolicy.NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Join(t.TempDir(), "run")
	b1 := newBackend(t, func(c *Config) { c.Network, c.RunDir = m1, runDir })
	spec := testSpec(t)
	spec.Network = backend.Network{Mode: "allowlist", Allow: []string{"pypi"}}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	first, err := b1.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	// The old daemon's connection to the agent goes with it.
	first.(*sandbox).dropSession()
	// The daemon "dies": its manager stops (the DNS proxy with it); the
	// VM's network stays because its QEMU holds the namespace.
	if err := m1.Close(); err != nil {
		t.Fatal(err)
	}
	m2 := newManager(t, cfg)
	b2 := newBackend(t, func(c *Config) { c.Network, c.RunDir = m2, runDir })
	sbx, err := b2.Recover(ctx, spec.ID, nil)
	if err != nil {
		t.Fatalf("recover: %v", err)
	}
	t.Cleanup(func() {
		_ = sbx.Stop(context.Background())
		if err := b2.Cleanup(context.Background(), spec.ID, nil); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	out := sh(t, sbx, `nslookup pypi.test >/dev/null && printf 'GET / HTTP/1.0\r\n\r\n' | timeout 20 nc 198.18.1.10 80 | tail -n1
printf 'GET / HTTP/1.0\r\n\r\n' | timeout 6 nc 198.18.1.30 80 | grep -q lab && echo "denied reached" || echo "denied unreachable"`)
	if !strings.Contains(out, "lab host 198.18.1.10") || !strings.Contains(out, "denied unreachable") {
		t.Errorf("after recovery the guest got %q", out)
	}
	st, err := sbx.(backend.Networker).NetworkStats(ctx)
	if err != nil || st.Total == 0 {
		t.Errorf("stats after recovery: %+v, %v", st, err)
	}
}
