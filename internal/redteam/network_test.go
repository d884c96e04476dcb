package redteam

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/netpolicy/netlab"
	"github.com/corral-dev/corral/internal/probeproto"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestProbeNetwork runs the probe's network rows in an allowlisted
// sandbox on a private test network (netlab: the node side and the test
// hosts live in namespaces of their own), then changes the rules while it
// runs and reads the refusal counters.
func TestProbeNetwork(t *testing.T) {
	const backend = "container"
	lab := testenv.NetLab(t)
	gw := netip.MustParseAddr("100.96.0.1")
	srv := testenv.StartServer(t, func(c *server.Config) {
		c.Network = testenv.LabNetwork(lab, "ct", map[string][]string{"pypi": {"pypi.test:80", "*.pypi.test:80"}, "npm": {"npm.test:80"}})
		c.Network.Subnet4 = netip.MustParsePrefix("100.96.0.0/16") // gateway gw
	})
	ctx := context.Background()
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend, Network: client.Network{Allow: []string{"pypi"}}})
	installProbe(t, sb)
	hp := func(a netip.Addr, port int) string { return netip.AddrPortFrom(a, uint16(port)).String() }
	in := probeproto.NetInput{
		Resolver:    hp(gw, 53),
		AllowedName: "pypi.test",
		AllowedURL:  fmt.Sprintf("http://%s/", hp(netlab.PyPI4, netlab.HTTPPort)),
		DeniedName:  "npm.test",
		DeniedTCP:   []string{hp(netlab.NPM4, netlab.HTTPPort), hp(netlab.Denied4, netlab.HTTPPort), hp(netlab.PyPI4, netlab.AltHTTPPort)},
		DeniedTCP6:  []string{hp(netlab.NPM6, netlab.HTTPPort), hp(netlab.Denied6, netlab.HTTPPort)},
		DeniedUDP:   hp(netlab.Denied4, netlab.UDPPort),
		DeniedICMP:  netlab.Denied4.String(),
		NodeAddrs:   []string{gw.String(), netlab.NodeUplink4.String(), "2001:db8::2"},
		Upstream:    hp(netlab.DNS4, 53),
	}
	stdin, _ := json.Marshal(in)
	results := runProbe(t, sb, stdin, "net")
	if len(results) < 12 {
		t.Fatalf("probe reported %d network results: %+v", len(results), results)
	}
	judge(t, backend, results)

	// The task moves to its next stage: npm instead of pypi.
	if _, err := sb.UpdateNetwork(ctx, client.NetworkUpdate{Allow: []string{"npm"}, Replace: true}); err != nil {
		t.Fatal(err)
	}
	get := func(a netip.Addr) *client.Result {
		return testenv.Run(t, sb, client.Command{Shell: `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 ` + a.String() + " 80"})
	}
	npm := testenv.Run(t, sb, client.Command{Shell: "nslookup npm.test"})
	npmGet, pypiGet := get(netlab.NPM4), get(netlab.PyPI4)
	judge(t, backend, []Result{check("net/rules-change",
		npm.ExitCode == 0 && strings.Contains(string(npmGet.Stdout), "lab host "+netlab.NPM4.String()) && pypiGet.ExitCode != 0,
		"after the update: npm.test resolves (exit %d), npm answers %q, pypi exit %d %q", npm.ExitCode, npmGet.Stdout, pypiGet.ExitCode, pypiGet.Stderr)})

	st, err := sb.NetworkStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	counted := map[string]bool{}
	for _, r := range st.Refusals {
		counted[r.Hook+" "+r.Address+" "+r.Name] = true
	}
	judge(t, backend, []Result{check("net/refusals-counted",
		st.RefusedTotal >= 10 && counted["connect "+netlab.Denied4.String()+" "] && counted["dns  npm.test"],
		"refused total %d, destinations %v", st.RefusedTotal, counted)})
}
