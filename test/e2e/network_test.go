package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/netpolicy/netlab"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// netServer is a server whose sandbox networking has the lab's node
// namespace as its node side, the lab's DNS as upstream and presets naming
// the lab's hosts.
func netServer(t *testing.T) *testenv.Server {
	t.Helper()
	lab := testenv.NetLab(t)
	return testenv.StartServer(t, func(c *server.Config) {
		c.Network = testenv.LabNetwork(lab, "ce", labPresets)
	})
}

// labPresets name the lab's hosts.
var labPresets = map[string][]string{"pypi": {"pypi.test:80"}, "npm": {"npm.test:80"}}

// httpGet is a shell command fetching / from addr port 80.
func httpGet(addr netip.Addr) string {
	return `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 ` + addr.String() + " 80"
}

func TestNetworkThroughTheAPI(t *testing.T) {
	srv := netServer(t)
	ctx := context.Background()
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Network: client.Network{Allow: []string{"pypi"}}})
	info, err := sb.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Network.Mode != client.NetworkAllowlist || strings.Join(info.Network.Allow, " ") != "pypi" {
		t.Errorf("network in Get: %+v", info.Network)
	}
	// (Busybox's static wget crashes in glibc's NSS even for an address:
	// HTTP goes through nc.)
	// Resolvers read /etc/resolv.conf, which names the node's DNS proxy.
	// (The static busybox's getaddrinfo cannot run without glibc's NSS
	// modules, so names go through its own nslookup.)
	if out := testenv.Sh(t, sb, "cat /etc/resolv.conf; nslookup pypi.test"); !strings.Contains(out, netlab.PyPI4.String()) {
		t.Errorf("allowed name: %q", out)
	}
	if out := testenv.Sh(t, sb, httpGet(netlab.PyPI4)); !strings.Contains(out, "lab host "+netlab.PyPI4.String()) {
		t.Errorf("allowed name's address: %q", out)
	}
	res := testenv.Run(t, sb, client.Command{Shell: "nslookup npm.test", Timeout: time.Minute})
	if res.ExitCode == 0 || strings.Contains(string(res.Stdout), netlab.NPM4.String()) {
		t.Errorf("denied name resolved: %q", res.Stdout)
	}
	res = testenv.Run(t, sb, client.Command{Shell: httpGet(netlab.NPM4), Timeout: time.Minute})
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "not permitted") {
		t.Errorf("denied address: exit %d stderr %q", res.ExitCode, res.Stderr)
	}

	// The task moves on: npm now, pypi no more.
	nw, err := sb.UpdateNetwork(ctx, client.NetworkUpdate{Allow: []string{"npm"}, Deny: []string{"pypi"}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(nw.Allow, " ") != "npm" {
		t.Errorf("policy after update: %+v", nw)
	}
	if out := testenv.Sh(t, sb, "nslookup npm.test >/dev/null && "+httpGet(netlab.NPM4)); !strings.Contains(out, "lab host "+netlab.NPM4.String()) {
		t.Errorf("newly allowed name: %q", out)
	}
	res = testenv.Run(t, sb, client.Command{Shell: httpGet(netlab.PyPI4), Timeout: time.Minute})
	if res.ExitCode == 0 {
		t.Errorf("revoked address still reachable: %q", res.Stdout)
	}
	st, err := sb.NetworkStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.RefusedTotal < 2 {
		t.Errorf("refused total %d, want the refused connects counted: %+v", st.RefusedTotal, st.Refusals)
	}
	// The same counter on the node's /metrics (API socket).
	// Prometheus writes labels in name order.
	if m := metrics(t, srv); !strings.Contains(m, fmt.Sprintf("corral_network_refused_total{sandbox=%q} ", sb.ID())) ||
		!regexp.MustCompile(`corral_network_refused_destination_total\{[^}]*hook="connect"[^}]*sandbox="`+sb.ID()+`"`).MatchString(m) {
		t.Errorf("metrics lack the sandbox's refusals:\n%s", m)
	}
	// And the event stream reports them at the node's next sample.
	ectx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	zero := uint64(0)
	var refused client.Event
	for e, err := range srv.Client.Events(ectx, client.EventOptions{After: &zero, SandboxIDs: []string{sb.ID()}, Types: []string{client.EventNetworkRefused}}) {
		if err != nil {
			t.Errorf("network_refused event: %v", err)
		}
		refused = e
		break
	}
	if refused.Figures["refused_total"] < 1 || !strings.HasPrefix(refused.Reason, "refused ") {
		t.Errorf("network_refused event: %+v", refused)
	}

	_, err = sb.UpdateNetwork(ctx, client.NetworkUpdate{Allow: []string{"nosuch"}})
	if err == nil || !strings.Contains(err.Error(), "unknown preset") {
		t.Errorf("unknown preset: %v", err)
	}
	_, err = sb.UpdateNetwork(ctx, client.NetworkUpdate{Allow: []string{"example.org:0"}})
	if err == nil || !strings.Contains(err.Error(), "allow[0]") {
		t.Errorf("bad rule: %v", err)
	}

	// A sandbox without a network stays without one.
	plain := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	if _, err := plain.UpdateNetwork(ctx, client.NetworkUpdate{Allow: []string{"pypi"}}); err == nil || !strings.Contains(err.Error(), "mode none") {
		t.Errorf("opening a none sandbox: %v", err)
	}
	if _, err := srv.Client.Create(ctx, client.CreateOptions{Network: client.Network{Mode: client.NetworkAllowlist, Allow: []string{"*.org"}}}); err == nil || !strings.Contains(err.Error(), "network.allow[0]") {
		t.Errorf("bad rule at create: %v", err)
	}
}

// TestNetworkSurvivesDaemonCrash: after a SIGKILL of the daemon the
// programs stay attached (the sandbox stays confined), and the restarted
// daemon finds the maps again: DNS answers, updates and counters work.
// A clean shutdown then removes the bridge, the veths and the NAT table.
func TestNetworkSurvivesDaemonCrash(t *testing.T) {
	lab := testenv.NetLab(t)
	d := newDaemon(t)
	netFlags := []string{"--net-node-netns", lab.NodePath, "--net-bridge", testenv.UniqueName("cr")[:11],
		"--net-dns-upstream", netip.AddrPortFrom(netlab.DNS4, 53).String(),
		"--net-preset", "pypi=pypi.test:80", "--net-preset", "npm=npm.test:80", "--net-pool", "1"}
	ctx := context.Background()
	c := d.start(netFlags...)
	sb, err := c.Create(ctx, client.CreateOptions{Network: client.Network{Allow: []string{"pypi"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID()
	t.Cleanup(func() {
		// A test that fails half-way leaves no sandbox running.
		for _, pid := range cgroupPids(d.parent, id) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	d.stop(syscall.SIGKILL)
	// With no daemon, the sandbox is still confined by its programs.
	c = d.start(netFlags...)
	sb = c.Sandbox(sb.ID())
	if out := testenv.Sh(t, sb, "nslookup pypi.test && "+httpGet(netlab.PyPI4)); !strings.Contains(out, "lab host "+netlab.PyPI4.String()) {
		t.Errorf("allowed after restart: %q", out)
	}
	if res := testenv.Run(t, sb, client.Command{Shell: httpGet(netlab.NPM4)}); res.ExitCode == 0 {
		t.Errorf("denied address reachable after restart: %q", res.Stdout)
	}
	if _, err := sb.UpdateNetwork(ctx, client.NetworkUpdate{Allow: []string{"npm"}, Replace: true}); err != nil {
		t.Fatal(err)
	}
	if out := testenv.Sh(t, sb, "nslookup npm.test && "+httpGet(netlab.NPM4)); !strings.Contains(out, "lab host "+netlab.NPM4.String()) {
		t.Errorf("update after restart: %q", out)
	}
	if res := testenv.Run(t, sb, client.Command{Shell: httpGet(netlab.PyPI4)}); res.ExitCode == 0 {
		t.Errorf("revoked address reachable: %q", res.Stdout)
	}
	st, err := sb.NetworkStats(ctx)
	if err != nil || st.RefusedTotal < 2 {
		t.Errorf("counters after restart: %+v %v", st, err)
	}
	d.stop(syscall.SIGTERM)
	d.start(append(netFlags, "--cleanup-on-exit")...)
	d.stop(syscall.SIGTERM)
	var links []string
	err = netpolicy.InNetns(lab.Node, func() error {
		ifs, err := net.Interfaces()
		for _, i := range ifs {
			links = append(links, i.Name)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(links, " ") != "lo uplink" {
		t.Errorf("node namespace after cleanup: %v", links)
	}
	testenv.AssertNoLeaks(t, d.dataDir, d.parent)
	testenv.RemoveCgroupParent(d.parent)
}

// TestBenchNetRuns runs `corral bench net` briefly: both figures and their
// peers are measured, nothing leaks (no timing is judged here).
func TestBenchNetRuns(t *testing.T) {
	testenv.RequireRoot(t)
	bins := testenv.Binaries(t)
	probe := filepath.Join(t.TempDir(), "corral-probe")
	build := exec.Command("go", "build", "-o", probe, "github.com/corral-dev/corral/cmd/corral-probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v\n%s", err, out)
	}
	cmd := exec.Command(filepath.Join(bins, "corral"), "bench", "net", "--json", "--n", "3", "--rounds", "1",
		"--duration", "500ms", "--probe", probe)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench net: %v", err)
	}
	var res struct {
		CreateReadyP50Ms     float64 `json:"create_ready_p50_ms"`
		CreateReadyNoneP50Ms float64 `json:"create_ready_none_p50_ms"`
		SandboxReqPerS       float64 `json:"sandbox_req_per_s"`
		HostReqPerS          float64 `json:"host_req_per_s"`
		ThroughputRatio      float64 `json:"throughput_ratio"`
		Leaked               int     `json:"leaked_sandboxes"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("bench output %q: %v", out, err)
	}
	if res.CreateReadyP50Ms <= 0 || res.CreateReadyNoneP50Ms <= 0 || res.SandboxReqPerS <= 0 || res.HostReqPerS <= 0 || res.ThroughputRatio <= 0 {
		t.Errorf("figures missing: %+v", res)
	}
	if res.Leaked != 0 {
		t.Errorf("leaked %d sandboxes", res.Leaked)
	}
}

// TestNetworkCLI drives `corral create --allow` and `corral net`.
func TestNetworkCLI(t *testing.T) {
	srv := netServer(t)
	bin := filepath.Join(testenv.Binaries(t), "corral")
	corral := func(args ...string) (string, error) {
		out, err := exec.Command(bin, append([]string{"--addr", srv.Addr}, args...)...).CombinedOutput()
		return string(out), err
	}
	out, err := corral("create", "--allow", "pypi", "--allow", netlab.Denied4.String()+":8080")
	if err != nil {
		t.Fatalf("create: %v: %s", err, out)
	}
	id := strings.TrimSpace(out)
	t.Cleanup(func() { _, _ = corral("rm", id) })
	if out, err := corral("exec", id, "--sh", httpGet(netlab.NPM4)); err == nil {
		t.Errorf("denied address reachable: %s", out)
	}
	out, err = corral("net", id)
	if err != nil || !strings.Contains(out, "mode: allowlist") || !strings.Contains(out, "allow: pypi "+netlab.Denied4.String()+":8080") ||
		!strings.Contains(out, netlab.NPM4.String()+" port 80") {
		t.Errorf("corral net: %v\n%s", err, out)
	}
	out, err = corral("net", id, "--allow", "npm", "--deny", "pypi")
	if err != nil || !strings.Contains(out, "allow: "+netlab.Denied4.String()+":8080 npm") {
		t.Errorf("corral net --allow --deny: %v\n%s", err, out)
	}
	if out, err := corral("exec", id, "--sh", "nslookup npm.test >/dev/null && "+httpGet(netlab.NPM4)); err != nil || !strings.Contains(out, "lab host") {
		t.Errorf("npm after the update: %v %s", err, out)
	}
	out, err = corral("--json", "net", id)
	var js struct { // the CLI's JSON: the API's field names
		Network struct {
			Mode string `json:"mode"`
		} `json:"network"`
		Stats struct {
			RefusedTotal uint64 `json:"refused_total"`
		} `json:"stats"`
	}
	if err != nil || json.Unmarshal([]byte(out), &js) != nil || js.Network.Mode != "allowlist" || js.Stats.RefusedTotal == 0 {
		t.Errorf("corral --json net: %v %+v\n%s", err, js, out)
	}
	if out, err := corral("create", "--allow", "*.org"); err == nil || !strings.Contains(out, "network.allow[0]") {
		t.Errorf("bad rule: %v %s", err, out)
	}
	if out, err := corral("create", "--net", "closed"); err == nil || !strings.Contains(out, "network.mode") {
		t.Errorf("bad mode: %v %s", err, out)
	}
}

// metrics reads the node's /metrics over its API socket.
func metrics(t *testing.T, srv *testenv.Server) string {
	t.Helper()
	return metricsAt(t, strings.TrimPrefix(srv.Addr, "unix://"))
}

// metricsAt reads /metrics over the API socket at path.
func metricsAt(t *testing.T, path string) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}}
	resp, err := hc.Get("http://corral/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics: %s: %s", resp.Status, body)
	}
	return string(body)
}
