package netpolicy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/netpolicy/netlab"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/testenv"
	"github.com/corral-dev/corral/internal/testenv/accept"
	"github.com/google/nftables"
	"github.com/miekg/dns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
)

// probeEnv makes the test binary run probe ops instead of tests: it is the
// program the tests start inside a sandbox's namespace and cgroup.
const probeEnv = "CORRAL_NETPOLICY_PROBE"

func TestMain(m *testing.M) {
	if ops := os.Getenv(probeEnv); ops != "" {
		for _, op := range strings.Split(ops, ";") {
			fmt.Println(runOp(strings.Fields(op)))
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runOp makes one attempt and returns "ok ..." or "err ERRNO".
func runOp(f []string) string {
	fail := func(err error) string {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return "err " + errnoName(errno)
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return "err timeout"
		}
		return "err " + err.Error()
	}
	switch f[0] {
	case "http": // http ADDR:PORT
		c := &http.Client{Timeout: 3 * time.Second}
		resp, err := c.Get("http://" + f[1] + "/")
		if err != nil {
			return fail(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return "ok " + strings.TrimSpace(string(b))
	case "hold": // hold ADDR:PORT MS: connect, wait MS, then send a request
		conn, err := net.DialTimeout("tcp", f[1], 2*time.Second)
		if err != nil {
			return fail(err)
		}
		defer conn.Close()
		ms, _ := strconv.Atoi(f[2])
		time.Sleep(time.Duration(ms) * time.Millisecond)
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
			return fail(err)
		}
		b, err := io.ReadAll(conn)
		if err != nil {
			return fail(err)
		}
		return "ok " + strings.TrimSpace(string(b[strings.LastIndex(string(b), "\n")+1:]))
	case "tcp": // tcp ADDR:PORT (connect only)
		conn, err := net.DialTimeout("tcp", f[1], 2*time.Second)
		if err != nil {
			return fail(err)
		}
		conn.Close()
		return "ok"
	case "udp": // udp ADDR:PORT: unconnected sendto, then wait for the echo
		pc, err := net.ListenPacket("udp", ":0")
		if err != nil {
			return fail(err)
		}
		defer pc.Close()
		to, _ := net.ResolveUDPAddr("udp", f[1])
		if _, err := pc.WriteTo([]byte("ping"), to); err != nil {
			return fail(err)
		}
		_ = pc.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, _, err := pc.ReadFrom(make([]byte, 64)); err != nil {
			return fail(err)
		}
		return "ok echo"
	case "icmp": // icmp ADDR (IPv4 echo on a ping socket)
		c, err := icmp.ListenPacket("udp4", "0.0.0.0")
		if err != nil {
			return fail(err)
		}
		defer c.Close()
		msg, _ := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: 1, Seq: 1, Data: []byte("x")}}).Marshal(nil)
		if _, err := c.WriteTo(msg, &net.UDPAddr{IP: net.ParseIP(f[1])}); err != nil {
			return fail(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if _, _, err := c.ReadFrom(make([]byte, 512)); err != nil {
			return fail(err)
		}
		return "ok reply"
	case "dns": // dns SERVER NAME TYPE
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(f[2]), dns.StringToType[f[3]])
		c := &dns.Client{Timeout: 2 * time.Second}
		r, _, err := c.Exchange(m, f[1])
		if err != nil {
			return fail(err)
		}
		var addrs []string
		for _, rr := range r.Answer {
			switch v := rr.(type) {
			case *dns.A:
				addrs = append(addrs, v.A.String())
			case *dns.AAAA:
				addrs = append(addrs, v.AAAA.String())
			}
		}
		return "ok " + dns.RcodeToString[r.Rcode] + " " + strings.Join(addrs, ",")
	}
	return "err unknown op " + f[0]
}

func errnoName(e syscall.Errno) string {
	switch e {
	case syscall.EPERM:
		return "EPERM"
	case syscall.ECONNREFUSED:
		return "ECONNREFUSED"
	case syscall.EACCES:
		return "EACCES"
	case syscall.ENETUNREACH:
		return "ENETUNREACH"
	}
	return e.Error()
}

// env is a lab, a manager whose node side is the lab's node namespace, and
// the cgroup v2 parent of the test's sandboxes.
type env struct {
	lab      *netlab.Lab
	m        *netpolicy.Manager
	cgParent string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	testenv.RequireRoot(t)
	h, err := cgroup.Detect()
	if err != nil || h.V2 == "" {
		t.Skip("needs a cgroup2 mount for the eBPF programs")
	}
	lab, err := netlab.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	m, err := netpolicy.NewManager(netpolicy.Config{
		Bridge:    testenv.UniqueName("cb")[:11],
		NodeNetns: lab.NodePath,
		Upstreams: []string{netip.AddrPortFrom(netlab.DNS4, 53).String()},
		Presets: map[string][]string{
			"pypi": {"pypi.test:80", "*.pypi.test:80"},
			"npm":  {"npm.test:80"},
		},
		PoolSize: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close manager: %v", err)
		}
	})
	parent := filepath.Join(h.V2, testenv.UniqueName("corral-nettest"))
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(parent) })
	return &env{lab: lab, m: m, cgParent: parent}
}

// sandbox is a cgroup with the policy's programs and a network namespace.
type sandbox struct {
	net *netpolicy.Sandbox
	cg  string
}

func (e *env) sandbox(t *testing.T, p netpolicy.Policy) *sandbox {
	t.Helper()
	cg := filepath.Join(e.cgParent, fmt.Sprintf("sb%d", time.Now().UnixNano()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	sb, err := e.m.Attach(context.Background(), filepath.Base(cg), cg, p)
	if err != nil {
		os.Remove(cg)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sb.Close()
		os.Remove(cg)
	})
	return &sandbox{net: sb, cg: cg}
}

// run runs probe ops inside the sandbox and returns one result per op.
func (s *sandbox) run(t *testing.T, ops ...string) []string {
	t.Helper()
	return s.start(t, ops...)()
}

// start starts probe ops inside the sandbox; wait returns their results.
func (s *sandbox) start(t *testing.T, ops ...string) (wait func() []string) {
	t.Helper()
	cgfd, err := os.Open(s.cg)
	if err != nil {
		t.Fatal(err)
	}
	defer cgfd.Close()
	cmd := exec.Command(os.Args[0])
	cmd.Env = []string{probeEnv + "=" + strings.Join(ops, ";")}
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgfd.Fd())}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Started from a thread inside the sandbox's namespace: the probe
	// inherits it.
	if err := netpolicy.InNetns(s.net.Netns(), cmd.Start); err != nil {
		t.Fatal(err)
	}
	return func() []string {
		t.Helper()
		var lines []string
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("probe: %v", err)
		}
		if len(lines) != len(ops) {
			t.Fatalf("probe printed %q for %d ops", lines, len(ops))
		}
		return lines
	}
}

func (s *sandbox) dnsServer() string {
	return netip.AddrPortFrom(s.net.Resolver(), 53).String()
}

func hostPort(a netip.Addr, port int) string { return netip.AddrPortFrom(a, uint16(port)).String() }

func expect(t *testing.T, what, got, wantPrefix string) {
	t.Helper()
	if !strings.HasPrefix(got, wantPrefix) {
		t.Errorf("%s: got %q, want %q…", what, got, wantPrefix)
	}
}

func TestAllowlist(t *testing.T) {
	e := newEnv(t)
	sb := e.sandbox(t, netpolicy.Policy{Mode: netpolicy.ModeAllowlist, Allow: []string{"pypi"}})
	d := sb.dnsServer()
	// Each row: an operation in the sandbox, what it shows, the outcome's
	// start.
	cases := []struct{ op, what, want string }{
		{"dns " + d + " pypi.test A", "allowed name resolves", "ok NOERROR " + netlab.PyPI4.String()},
		{"dns " + d + " pypi.test AAAA", "allowed name resolves (IPv6)", "ok NOERROR " + netlab.PyPI6.String()},
		{"http " + hostPort(netlab.PyPI4, netlab.HTTPPort), "allowed name reachable", "ok lab host " + netlab.PyPI4.String()},
		{"http " + hostPort(netlab.PyPI6, netlab.HTTPPort), "allowed name reachable over IPv6", "ok lab host " + netlab.PyPI6.String()},
		{"dns " + d + " npm.test A", "denied name refused by DNS", "ok REFUSED"},
		{"http " + hostPort(netlab.NPM4, netlab.HTTPPort), "denied server's IP", "err EPERM"},
		{"tcp " + hostPort(netlab.Denied4, netlab.HTTPPort), "never-resolved host", "err EPERM"},
		{"tcp " + hostPort(netlab.Denied6, netlab.HTTPPort), "never-resolved host (IPv6)", "err EPERM"},
		{"tcp " + hostPort(netlab.PyPI4, netlab.AltHTTPPort), "allowed host, other port", "err EPERM"},
		{"tcp [::ffff:" + netlab.Denied4.String() + "]:80", "denied host as an IPv4-mapped IPv6 address", "err EPERM"},
		{"udp " + hostPort(netlab.Denied4, netlab.UDPPort), "UDP to a denied host", "err EPERM"},
		{"udp " + hostPort(netlab.PyPI4, netlab.UDPPort), "UDP to an allowed host on TCP only", "err EPERM"},
		{"icmp " + netlab.Denied4.String(), "ICMP to a denied host", "err EPERM"},
		{"dns " + hostPort(netlab.DNS4, 53) + " pypi.test A", "direct query to the upstream resolver", "err EPERM"},
		{"dns " + d + " pypi.test TXT", "TXT (tunnelling) for an allowed name", "ok REFUSED"},
		{"dns " + d + " rebind.pypi.test A", "rebinding answer stripped", "ok NOERROR "},
	}
	var ops []string
	for _, c := range cases {
		ops = append(ops, c.op)
	}
	got := sb.run(t, ops...)
	for i, c := range cases {
		expect(t, c.what, got[i], c.want)
	}
	if strings.Contains(got[15], "10.1.2.3") || strings.Contains(got[15], "169.254") {
		t.Errorf("rebinding answer reached the sandbox: %q", got[15])
	}

	st, err := sb.net.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Total < 8 {
		t.Errorf("refused total %d, want at least the 8 refused connects, sends and packets", st.Total)
	}
	found := map[string]bool{}
	for _, r := range st.Refusals {
		found[fmt.Sprintf("%s %s %s:%d", r.Hook, r.Proto, r.Addr, r.Port)] = true
		if r.Hook == "dns" {
			found["dns "+r.Name] = true
		}
	}
	for _, want := range []string{
		"connect tcp " + netlab.NPM4.String() + ":80",
		"connect tcp " + netlab.PyPI4.String() + ":8080",
		"sendmsg udp " + netlab.Denied4.String() + ":9999",
		"connect udp " + netlab.DNS4.String() + ":53",
		"dns npm.test",
	} {
		if !found[want] {
			t.Errorf("no refusal counted for %q; counted %v", want, found)
		}
	}
}

func TestNodeScanFindsNothing(t *testing.T) {
	e := newEnv(t)
	ln, err := e.lab.Listen(":8081")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accept.Each(ln, func(c net.Conn) { c.Close() })
	sb := e.sandbox(t, netpolicy.Policy{Mode: netpolicy.ModeOpen})
	gw := sb.net.Resolver()
	var ops []string
	for _, a := range []string{netlab.NodeUplink4.String(), gw.String(), "[2001:db8::2]", "169.254.169.254", "10.0.0.1", "[fd00:ec2::254]"} {
		for _, p := range []string{"22", "80", "8081"} {
			ops = append(ops, "tcp "+a+":"+p)
		}
	}
	ops = append(ops, "udp "+netlab.NodeUplink4.String()+":9999", "icmp "+gw.String(), "icmp "+netlab.NodeUplink4.String())
	for i, got := range sb.run(t, ops...) {
		expect(t, ops[i], got, "err EPERM")
	}
	// Open mode still reaches the lab internet, by address.
	got := sb.run(t, "http "+hostPort(netlab.Denied4, netlab.AltHTTPPort), "icmp "+netlab.Denied4.String())
	expect(t, "open mode reaches the internet", got[0], "ok lab host")
	expect(t, "open mode pings the internet", got[1], "ok reply")
}

func TestUpdateTakesEffect(t *testing.T) {
	e := newEnv(t)
	sb := e.sandbox(t, netpolicy.Policy{Mode: netpolicy.ModeAllowlist, Allow: []string{"npm"}})
	d := sb.dnsServer()
	got := sb.run(t, "dns "+d+" npm.test A", "http "+hostPort(netlab.NPM4, netlab.HTTPPort), "dns "+d+" pypi.test A")
	expect(t, "npm allowed", got[1], "ok lab host")
	expect(t, "pypi not yet", got[2], "ok REFUSED")
	// A connection opened under the old rules, used after the update.
	held := sb.start(t, "hold "+hostPort(netlab.NPM4, netlab.HTTPPort)+" 1000")
	time.Sleep(300 * time.Millisecond)

	start := time.Now()
	if err := sb.net.Update(context.Background(), netpolicy.Policy{Mode: netpolicy.ModeAllowlist, Allow: []string{"pypi"}}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	expect(t, "connection to a revoked destination cut", held()[0], "err")
	got = sb.run(t, "http "+hostPort(netlab.NPM4, netlab.HTTPPort), "dns "+d+" npm.test A", "dns "+d+" pypi.test A", "http "+hostPort(netlab.PyPI4, netlab.HTTPPort))
	expect(t, "npm revoked (learned address gone)", got[0], "err EPERM")
	expect(t, "npm name revoked", got[1], "ok REFUSED")
	expect(t, "pypi now allowed", got[3], "ok lab host")
	t.Logf("update took %v", took) // in force when Update returns
	if p := sb.net.Policy(); len(p.Allow) != 1 || p.Allow[0] != "pypi" {
		t.Errorf("policy after update: %+v", p)
	}
}

func TestSandboxesDoNotShareAllowances(t *testing.T) {
	e := newEnv(t)
	a := e.sandbox(t, netpolicy.Policy{Mode: netpolicy.ModeAllowlist, Allow: []string{"pypi"}})
	b := e.sandbox(t, netpolicy.Policy{Mode: netpolicy.ModeAllowlist, Allow: []string{"npm"}})
	got := a.run(t, "dns "+a.dnsServer()+" pypi.test A", "http "+hostPort(netlab.PyPI4, netlab.HTTPPort))
	expect(t, "a reaches pypi", got[1], "ok lab host")
	a4, _ := a.net.Addrs()
	got = b.run(t, "http "+hostPort(netlab.PyPI4, netlab.HTTPPort), "dns "+b.dnsServer()+" pypi.test A", "tcp "+hostPort(a4, 80))
	expect(t, "b does not get a's learned pypi address", got[0], "err EPERM")
	expect(t, "b's DNS refuses pypi", got[1], "ok REFUSED")
	expect(t, "b cannot reach sandbox a", got[2], "err EPERM")
}

func TestCIDRAndPortRules(t *testing.T) {
	e := newEnv(t)
	sb := e.sandbox(t, netpolicy.Policy{Mode: netpolicy.ModeAllowlist, Allow: []string{
		netlab.Denied4.String() + ":8080", "[" + netlab.Denied6.String() + "]:9999/udp", netlab.NPM4.String() + "/icmp",
	}})
	got := sb.run(t,
		"http "+hostPort(netlab.Denied4, netlab.AltHTTPPort),
		"tcp "+hostPort(netlab.Denied4, netlab.HTTPPort),
		"udp "+hostPort(netlab.Denied6, netlab.UDPPort),
		"tcp "+hostPort(netlab.Denied6, netlab.UDPPort),
		"icmp "+netlab.NPM4.String(),
		"tcp "+hostPort(netlab.NPM4, netlab.HTTPPort),
	)
	expect(t, "listed address and port", got[0], "ok lab host")
	expect(t, "listed address, other port", got[1], "err EPERM")
	expect(t, "listed IPv6 UDP port", got[2], "ok echo")
	expect(t, "listed IPv6 UDP port over TCP", got[3], "err EPERM")
	expect(t, "listed ICMP", got[4], "ok reply")
	expect(t, "ICMP-only host over TCP", got[5], "err EPERM")
}

// TestCleanup: closing a sandbox removes its veth; closing the manager
// removes the pool's namespaces, the bridge and the NAT table; Sweep
// removes a veth no sandbox claims.
func TestCleanup(t *testing.T) {
	e := newEnv(t)
	sb := e.sandbox(t, netpolicy.Policy{Mode: netpolicy.ModeAllowlist})
	links := func() []string {
		var names []string
		err := netpolicy.InNetns(e.lab.Node, func() error {
			ifs, err := net.Interfaces()
			for _, i := range ifs {
				names = append(names, i.Name)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	veth := sb.net.Record().HostVeth
	if !slices.Contains(links(), veth) {
		t.Fatalf("veth %s missing: %v", veth, links())
	}
	// A crash leaves the veth of a sandbox the manager no longer knows.
	if err := e.m.Sweep(func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(links(), veth) {
		t.Fatalf("Sweep removed the veth of a live sandbox")
	}
	if err := sb.net.Close(); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(links(), veth) {
		t.Errorf("veth %s outlived its sandbox", veth)
	}
	if err := e.m.Close(); err != nil {
		t.Fatal(err)
	}
	if got := links(); !slices.Equal(got, []string{"lo", "uplink"}) {
		t.Errorf("node namespace after Close has %v, want only lo and uplink", got)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(e.lab.Node.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 0 {
		t.Errorf("nftables tables left: %d", len(tables))
	}
}
