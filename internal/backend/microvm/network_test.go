package microvm

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/netpolicy/netlab"
)

// TestNetworkAllowlist boots one networked microVM on a lab internet and
// checks from inside the guest that the tc program on its veth enforces
// the policy the cgroup programs enforce for containers: the allowed name
// resolves and answers over IPv4 and IPv6, a denied name is refused by the
// DNS proxy, a denied address and the upstream DNS server are unreachable
// (dropped: a timeout in the guest), refusals are counted, and deleting
// the sandbox leaves no veth behind.
func TestNetworkAllowlist(t *testing.T) {
	lab, err := netlab.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	m, err := netpolicy.NewManager(netpolicy.Config{
		Bridge:    fmt.Sprintf("cv%x", time.Now().UnixNano()&0xffffffff),
		NodeNetns: lab.NodePath,
		Upstreams: []string{netip.AddrPortFrom(netlab.DNS4, 53).String()},
		Presets:   map[string][]string{"pypi": {"pypi.test:80"}},
		PoolSize:  1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close manager: %v", err)
		}
	})
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
		// pass the identity checks.
		if r.Hook == "spoof" {
			t.Errorf("the guest's own frames were counted as forged: %+v", r)
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
