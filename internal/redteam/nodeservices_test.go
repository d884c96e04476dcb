package redteam

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/netpolicy/netlab"
	"github.com/corral-dev/corral/internal/probeproto"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// The rows of this file attack the node's own services from inside a
// container sandbox (issue 21, round 2): the DNS proxy (its descriptors,
// CPU and log) and the host conntrack table, and check that the node
// keeps serving everyone else meanwhile. The node's limits are per node,
// whichever backend floods them, so they run on the container backend.

// nodeLab is a server whose sandboxes reach a private test network
// (netlab) with an upstream resolver of the suite's own (the probe's
// "dnsserver", a process outside the daemon, so that the daemon's CPU is
// the proxy's alone), its log in a file.
type nodeLab struct {
	lab     *netlab.Lab
	srv     *testenv.Server
	logPath string
	gw      netip.Addr
}

// upstreamPort is where the probe's resolver listens on netlab.DNS4.
const upstreamPort = 5353

func startNodeLab(t *testing.T, mutate ...func(*server.Config)) *nodeLab {
	t.Helper()
	lab := testenv.NetLab(t)
	up := netip.AddrPortFrom(netlab.DNS4, upstreamPort).String()
	// nsenter joins the lab's internet namespace, passed as fd 3.
	cmd := exec.Command("nsenter", "--net=/proc/self/fd/3", probeBin, "dnsserver", up)
	cmd.ExtraFiles = []*os.File{lab.Internet}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("start the suite's upstream resolver: %v (needs nsenter from util-linux)", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("upstream resolver: %q %v", line, err)
	}
	logPath := filepath.Join(t.TempDir(), "node.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logFile.Close() })
	srv := testenv.StartServer(t, func(c *server.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logFile, nil))
		c.Network = testenv.LabNetwork(lab, "crn", nil)
		c.Network.Subnet4 = netip.MustParsePrefix("100.96.0.0/16")
		c.Network.Upstreams = []string{up}
		for _, m := range mutate {
			m(c)
		}
	})
	return &nodeLab{lab: lab, srv: srv, logPath: logPath, gw: netip.MustParseAddr("100.96.0.1")}
}

// resolver is the DNS proxy as a sandbox sees it.
func (l *nodeLab) resolver() string { return netip.AddrPortFrom(l.gw, 53).String() }

// flood runs the probe's dnsflood in sb and returns its result.
func flood(t *testing.T, sb *client.Sandbox, in probeproto.FloodInput) probeproto.FloodResult {
	t.Helper()
	stdin, _ := json.Marshal(in)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(in.Seconds)*time.Second+2*time.Minute)
	defer cancel()
	res, err := sb.Run(ctx, client.Command{Args: []string{"/corral-probe/corral-probe", "dnsflood"}, Stdin: stdin, Timeout: time.Duration(in.Seconds)*time.Second + time.Minute})
	if err != nil {
		t.Errorf("flood %s: %v", in.Kind, err)
		return probeproto.FloodResult{}
	}
	var r probeproto.FloodResult
	if err := json.Unmarshal(res.Stdout, &r); err != nil {
		t.Errorf("flood %s: exit %d, output %q %q: %v", in.Kind, res.ExitCode, res.Stdout, res.Stderr, err)
	}
	return r
}

// daemonFDs counts the open descriptors of this process: the daemon's,
// since the test server runs in it.
func daemonFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

// watchFDs samples daemonFDs every 50 ms until stop is closed and returns
// the highest count.
func watchFDs(stop <-chan struct{}) <-chan int {
	out := make(chan int, 1)
	go func() {
		most := 0
		for {
			most = max(most, daemonFDs())
			select {
			case <-stop:
				out <- most
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return out
}

// limitRefusals returns the sandbox's refusals with hook "limit", by name.
func limitRefusals(t *testing.T, sb *client.Sandbox) map[string]uint64 {
	st, err := sb.NetworkStats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, r := range st.Refusals {
		if r.Hook == "limit" {
			out[r.Name] += r.Count
		}
	}
	return out
}

// judgeNode is judge, with each row's measurements in the test log too.
func judgeNode(t *testing.T, backend string, results []Result) {
	t.Helper()
	for _, r := range results {
		t.Logf("%s: %s: %s", r.Name, r.Outcome, r.Detail)
	}
	judge(t, backend, results)
}

// countLines counts the lines of path that contain s.
func countLines(path, s string) int {
	b, _ := os.ReadFile(path)
	return strings.Count(string(b), s)
}

// TestNodeDNSFloodFDs: one sandbox holds thousands of TCP connections to
// the DNS proxy, then floods it over UDP with names whose upstream answer
// never comes in time (finding 1). The daemon's descriptors must stay
// within the proxy's per-sandbox limits, the refusals must be counted
// for the sandbox, and the node log must get summary lines, not a line
// per query.
func TestNodeDNSFloodFDs(t *testing.T) {
	const backend = "container"
	l := startNodeLab(t)
	sb := testenv.NewSandbox(t, l.srv.Client, client.CreateOptions{Backend: backend, Network: client.Network{Allow: []string{"*.slow.test:80", "*.wild.test:80"}}})
	installProbe(t, sb)
	// What one sandbox may make the proxy hold: its TCP connections and
	// its upstream sockets (16 each by default), plus slack for the
	// daemon's own comings and goings.
	const allowance = 64

	base := daemonFDs()
	stop := make(chan struct{})
	most := watchFDs(stop)
	tcp := flood(t, sb, probeproto.FloodInput{Kind: "tcp", Resolver: l.resolver(), Suffix: "slow.test", Conns: 4000, Seconds: 15})
	close(stop)
	grew := <-most - base
	lim := limitRefusals(t, sb)
	judgeNode(t, backend, []Result{check("node/dns-tcp-conn-flood", grew <= allowance && lim["dns-tcp-conns"] > 0,
		"daemon fds %d at rest, +%d during the flood (allowed +%d); flood %+v; limit refusals %v", base, grew, allowance, tcp, lim)})

	logBefore := countLines(l.logPath, "dns proxy")
	base = daemonFDs()
	stop = make(chan struct{})
	most = watchFDs(stop)
	udp := flood(t, sb, probeproto.FloodInput{Kind: "udp", Resolver: l.resolver(), Suffix: "slow.test", Seconds: 15})
	close(stop)
	grew = <-most - base
	lim = limitRefusals(t, sb)
	judgeNode(t, backend, []Result{check("node/dns-udp-flood-fds", grew <= allowance && lim["dns-rate"]+lim["dns-rate-kernel"]+lim["dns-upstream"]+lim["dns-in-flight"] > 0,
		"daemon fds %d at rest, +%d during the flood (allowed +%d); flood %+v; limit refusals %v", base, grew, allowance, udp, lim)})
	// Upstream failures end 5 s after the last query; the summary of the
	// interval they fall in comes at most 10 s later.
	time.Sleep(16 * time.Second)
	lines := countLines(l.logPath, "dns proxy") - logBefore
	// One summary per 10 s interval for the sandbox, one for upstream
	// failures: four intervals at most over the flood and its tail.
	const maxLines = 12
	judgeNode(t, backend, []Result{check("node/dns-log-flood", lines <= maxLines,
		"%d node log lines about the DNS proxy for %d queries (allowed %d)", lines, udp.Sent, maxLines)})
}

// sandboxCPU returns the CPU time the sandbox's cgroup has used.
func sandboxCPU(t *testing.T, parent, id string) time.Duration {
	// cpuacct co-mounted with cpu holds the sandbox's cgroup beside the
	// parent (parent@id, as the cpu hierarchy does), else under it.
	for _, d := range []string{"/sys/fs/cgroup/cpuacct/" + parent + "/" + id, "/sys/fs/cgroup/cpu,cpuacct/" + parent + "@" + id} {
		if b, err := os.ReadFile(filepath.Join(d, "cpuacct.usage")); err == nil {
			ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return time.Duration(ns)
		}
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", parent, id, "cpu.stat"))
	if err != nil {
		t.Fatalf("sandbox %s: no CPU accounting found: %v", id, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, _ := strconv.ParseInt(v, 10, 64)
			return time.Duration(us) * time.Microsecond
		}
	}
	t.Fatalf("sandbox %s: no usage_usec in cpu.stat", id)
	return 0
}

// processCPU is this process's (the daemon's) user+system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestNodeDNSCPU: a sandbox limited to half a core floods the proxy with
// distinct names a wildcard rule allows (finding 2: the daemon spent 29×
// the sandbox's CPU, more as its learned set grew): once as fast as it
// can send, once from 64 sockets that each wait for their answer, as a
// resolver library does. Over the first the daemon's CPU must not exceed
// the sandbox's; over the second, where the sandbox mostly waits, within
// three times it (1.6–2.2× measured; 29× before): a proxy receives,
// forwards, waits, allows and answers where its client only asks, but its
// work per answer must stay constant (it grew with the learned set before)
// and the rate bounds the answers. The daemon's CPU at rest is taken off.
func TestNodeDNSCPU(t *testing.T) {
	const backend = "container"
	l := startNodeLab(t)
	sb := testenv.NewSandbox(t, l.srv.Client, client.CreateOptions{Backend: backend,
		Resources: client.Resources{CPUMillis: 500}, Network: client.Network{Allow: []string{"*.wild.test:80"}}})
	installProbe(t, sb)
	parent := l.srv.Config.CgroupParent
	// The daemon's own background work (stats sampling, reaping) is not
	// the flood's: measure it at rest and take it off the flood's figure.
	const rest = 5 * time.Second
	idle0 := processCPU()
	time.Sleep(rest)
	idlePerSec := (processCPU() - idle0).Seconds() / rest.Seconds()
	var rows []Result
	for _, f := range []struct {
		in      probeproto.FloodInput
		allowed float64 // daemon/sandbox
	}{
		{probeproto.FloodInput{Kind: "udp", Resolver: l.resolver(), Suffix: "wild.test", Seconds: 10}, 1},
		{probeproto.FloodInput{Kind: "udp-wait", Resolver: l.resolver(), Suffix: "wild.test", Conns: 64, Seconds: 10}, 3},
	} {
		in := f.in
		sb0, d0, start := sandboxCPU(t, parent, sb.ID()), processCPU(), time.Now()
		r := flood(t, sb, in)
		sbCPU, dCPU := sandboxCPU(t, parent, sb.ID())-sb0, processCPU()-d0
		dCPU -= time.Duration(idlePerSec * float64(time.Since(start)))
		ratio := dCPU.Seconds() / max(sbCPU.Seconds(), 1e-9)
		report.Logf("node/dns-cpu-amplification (%s): %d queries (%d answered) in 10 s; sandbox CPU %v, daemon CPU %v beyond its rest rate: daemon/sandbox %.2f",
			in.Kind, r.Sent, r.Answered, sbCPU.Round(time.Millisecond), dCPU.Round(time.Millisecond), ratio)
		rows = append(rows, check("node/dns-cpu-amplification", ratio <= f.allowed && r.Sent > 0,
			"%s: sandbox CPU %v, daemon CPU %v (daemon/sandbox %.2f, allowed %g); flood %+v; limit refusals %v",
			in.Kind, sbCPU, dCPU, ratio, f.allowed, r, limitRefusals(t, sb)))
	}
	judgeNode(t, backend, rows)
}

// nodeConntrack counts the conntrack entries of the node namespace whose
// original source is addr.
func nodeConntrack(t *testing.T, l *nodeLab, addr netip.Addr) int {
	var n int
	err := netpolicy.InNetns(l.lab.Node, func() error {
		// thread-self: this thread is the one in the node namespace.
		b, err := os.ReadFile("/proc/thread-self/net/nf_conntrack")
		if err == nil {
			n = strings.Count(string(b), " src="+addr.String()+" ")
		}
		return err
	})
	if err != nil {
		t.Skipf("no conntrack table to read in the node namespace: %v", err)
	}
	return n
}

// sandboxAddr4 is the sandbox's IPv4 address, as its eth0 has it.
func sandboxAddr4(t *testing.T, sb *client.Sandbox) netip.Addr {
	out := testenv.Sh(t, sb, "ip -o -4 addr show dev eth0")
	for _, f := range strings.Fields(out) {
		if p, err := netip.ParsePrefix(f); err == nil {
			return p.Addr()
		}
	}
	t.Fatalf("no IPv4 address on eth0: %q", out)
	return netip.Addr{}
}

// TestNodeConntrack: a sandbox sends UDP from 20,000 source ports, to the
// DNS proxy (the node's input) and to an allowed host (forwarded), each a
// new conntrack entry (finding 8: 64,512 entries in 4 s, no cap). The
// node's table must grow by no more than the per-sandbox cap, and the
// refusals must be counted for the sandbox.
func TestNodeConntrack(t *testing.T) {
	const backend = "container"
	l := startNodeLab(t)
	echo := netip.AddrPortFrom(netlab.Denied4, netlab.UDPPort)
	sb := testenv.NewSandbox(t, l.srv.Client, client.CreateOptions{Backend: backend,
		Network: client.Network{Allow: []string{fmt.Sprintf("%s/32:%d/udp", echo.Addr(), echo.Port()), "*.wild.test:80"}}})
	installProbe(t, sb)
	const ctCap, ports = 4096, 20000 // netpolicy's default cap
	addr := sandboxAddr4(t, sb)
	before := nodeConntrack(t, l, addr)
	toProxy := flood(t, sb, probeproto.FloodInput{Kind: "ports", Target: l.resolver(), Suffix: "wild.test", Conns: ports / 2, Seconds: 60})
	toHost := flood(t, sb, probeproto.FloodInput{Kind: "ports", Target: echo.String(), Suffix: "wild.test", Conns: ports / 2, Seconds: 60})
	grew := nodeConntrack(t, l, addr) - before
	lim := limitRefusals(t, sb)
	judgeNode(t, backend, []Result{check("node/conntrack-cap", grew <= ctCap && lim["conntrack"] > 0,
		"node conntrack entries from the sandbox +%d after %d datagrams to the proxy and %d to %s from fresh ports (cap %d); limit refusals %v",
		grew, toProxy.Sent, toHost.Sent, echo, ctCap, lim)})
}

// p99 returns the 99th percentile of samples (their largest below 100).
func p99(samples []time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return s[(len(s)*99)/100]
}

// nodeLatencies measures, for d, `corral ls` and another sandbox's
// create (networked, like the attacker) and exec, each exec followed by
// the host's own fork+exec of /bin/true (host, the exec's peer).
func nodeLatencies(t *testing.T, l *nodeLab, b *client.Sandbox, d time.Duration) (ls, create, execs, host []time.Duration) {
	ctx := context.Background()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		start := time.Now()
		if _, err := l.srv.Client.List(ctx, client.ListOptions{}); err != nil {
			t.Errorf("ls: %v", err)
		}
		ls = append(ls, time.Since(start))
		start = time.Now()
		sb, err := l.srv.Client.Create(ctx, client.CreateOptions{Backend: "container", Network: client.Network{Allow: []string{"*.wild.test:80"}}})
		if err != nil {
			t.Errorf("create: %v", err)
			continue
		}
		create = append(create, time.Since(start))
		_ = sb.Delete(ctx)
		for range 10 {
			start = time.Now()
			res, err := b.Run(ctx, client.Command{Args: []string{"true"}})
			if err != nil || res.ExitCode != 0 {
				t.Errorf("exec in B: %v %+v", err, res)
				continue
			}
			execs = append(execs, time.Since(start))
			if took, err := hostTrue(); err == nil {
				host = append(host, took)
			}
		}
	}
	return ls, create, execs, host
}

// TestNodeDNSFloodNoisy: while sandbox A floods the DNS proxy over TCP
// (thousands of connections) and UDP (distinct allowed names), `corral
// ls` must answer within 100 ms and sandbox B's creates and execs keep
// being served; their p99 against idle (target 2×) goes in the report.
// Idle and flood windows alternate, three of each, so that the host's
// other work (this machine is shared) weighs on both alike; the ratio
// reported is the median of the three pairs' p99 ratios.
//
// The daemon runs in a node cgroup of its own (`corral serve
// --node-cgroup`, on by default); CORRAL_REDTEAM_NODE_CGROUP=off measures
// it without, in its starting cgroup at a sandbox parent's weight.
func TestNodeDNSFloodNoisy(t *testing.T) {
	const backend = "container"
	nodeCgroup := os.Getenv("CORRAL_REDTEAM_NODE_CGROUP") != "off"
	l := startNodeLab(t, func(c *server.Config) {
		if nodeCgroup {
			c.NodeCgroup = c.CgroupParent + "-node"
		}
	})
	net := client.Network{Allow: []string{"*.wild.test:80", "*.slow.test:80"}}
	// A gets the half core of the attack: its own processes'
	// CPU is the CPU-spin row's concern; this one is what the flood makes
	// the node spend.
	a := testenv.NewSandbox(t, l.srv.Client, client.CreateOptions{Backend: backend, Network: net, Resources: client.Resources{CPUMillis: 500}})
	b := testenv.NewSandbox(t, l.srv.Client, client.CreateOptions{Backend: backend, Network: net})
	installProbe(t, a)
	const window, ramp, rounds = 8 * time.Second, 5 * time.Second, 3
	parent := l.srv.Config.CgroupParent
	var idleLs, idleCreate, idleExec, ls, create, execs []time.Duration
	var idleDaemon, idleIRQ, floodDaemon, floodIRQ, floodA, idleWait, floodWait time.Duration
	var idleGo, floodGo goWaits
	var createRatio, execRatio, hostRatio []float64
	var tcp, udp probeproto.FloodResult
	for range rounds {
		cpu0, irq0, w0, g0 := processCPU(), softirqTime(), runQueueWait(), goRunnableWaits()
		iLs, iCreate, iExec, iHost := nodeLatencies(t, l, b, window)
		idleDaemon, idleIRQ, idleWait = idleDaemon+processCPU()-cpu0, idleIRQ+softirqTime()-irq0, idleWait+runQueueWait()-w0
		idleGo.add(g0, goRunnableWaits())

		var wg sync.WaitGroup
		var rt, ru probeproto.FloodResult
		secs := (ramp + window + time.Second).Seconds()
		wg.Add(2)
		go func() {
			defer wg.Done()
			rt = flood(t, a, probeproto.FloodInput{Kind: "tcp", Resolver: l.resolver(), Suffix: "slow.test", Conns: 4000, Seconds: secs})
		}()
		go func() {
			defer wg.Done()
			ru = flood(t, a, probeproto.FloodInput{Kind: "udp", Resolver: l.resolver(), Suffix: "wild.test", Seconds: secs})
		}()
		time.Sleep(ramp) // the connections are open, the queries flowing
		cpu0, irq0, a0, w0, g0 := processCPU(), softirqTime(), sandboxCPU(t, parent, a.ID()), runQueueWait(), goRunnableWaits()
		fLs, fCreate, fExec, fHost := nodeLatencies(t, l, b, window)
		floodDaemon, floodIRQ, floodA = floodDaemon+processCPU()-cpu0, floodIRQ+softirqTime()-irq0, floodA+sandboxCPU(t, parent, a.ID())-a0
		floodWait += runQueueWait() - w0
		floodGo.add(g0, goRunnableWaits())
		wg.Wait()
		tcp.Sent, tcp.Opened, tcp.Errors, udp.Sent = tcp.Sent+rt.Sent, tcp.Opened+rt.Opened, tcp.Errors+rt.Errors, udp.Sent+ru.Sent

		createRatio = append(createRatio, ratio(fCreate, iCreate))
		execRatio = append(execRatio, ratio(fExec, iExec))
		hostRatio = append(hostRatio, ratio(fHost, iHost))
		idleLs, idleCreate, idleExec = append(idleLs, iLs...), append(idleCreate, iCreate...), append(idleExec, iExec...)
		ls, create, execs = append(ls, fLs...), append(create, fCreate...), append(execs, fExec...)
	}
	cr, er := medianRatio(createRatio), medianRatio(execRatio)
	figures := fmt.Sprintf("ls p99 %v (idle %v); B create p99 %v (idle %v, %d samples), flood/idle %.2f (median of %v); B exec p99 %v (idle %v, %d samples), flood/idle %.2f (median of %v); the host's fork/exec beside B's execs, flood/idle %.2f (median of %v); load %s; flood tcp sent %d opened %d errors %d, udp sent %d",
		p99(ls).Round(time.Microsecond), p99(idleLs).Round(time.Microsecond),
		p99(create).Round(time.Millisecond), p99(idleCreate).Round(time.Millisecond), len(create), cr, roundRatios(createRatio),
		p99(execs).Round(time.Microsecond), p99(idleExec).Round(time.Microsecond), len(execs), er, roundRatios(execRatio),
		medianRatio(hostRatio), roundRatios(hostRatio),
		loadAverage(), tcp.Sent, tcp.Opened, tcp.Errors, udp.Sent)
	// The 2× target is a measurement reported with the table (as the
	// CPU-spin neighbour rows do): on a shared 2-core host the ratio
	// follows the machine's load. The rows assert that B's creates and
	// execs keep being served through the flood.
	within := func(r float64) string {
		if r <= 2 {
			return fmt.Sprintf("%.2fx, within 2x", r)
		}
		return fmt.Sprintf("%.2fx, OVER 2x", r)
	}
	report.Logf("node/dns-flood-* (node cgroup %v): %s; create %s, exec %s of idle", nodeCgroup, figures, within(cr), within(er))
	// Who pays for the flood, over the flood windows against the idle
	// ones: the attacker's cgroup, the daemon (B's creates and execs
	// included in both), and the host's softirq time, charged to no one.
	// And what an exec over 2× waited for: the daemon's threads' time
	// runnable but not running (its API work behind its own DNS work, at
	// the node's weight, docs/limits.md).
	// And, inside the daemon, how long its goroutines waited runnable for
	// one of Go's Ps (its API work behind its DNS work in Go's own queues).
	report.Logf("node/dns-flood-* CPU over %d × %v (node cgroup %v): A %v; daemon %v (idle windows %v); host softirq %v (idle windows %v); daemon threads waiting for a CPU %v (idle windows %v); goroutines waiting for a P: %s (idle windows %s)",
		rounds, window, nodeCgroup, floodA.Round(time.Millisecond), floodDaemon.Round(time.Millisecond), idleDaemon.Round(time.Millisecond),
		floodIRQ.Round(time.Millisecond), idleIRQ.Round(time.Millisecond), floodWait.Round(time.Millisecond), idleWait.Round(time.Millisecond),
		floodGo, idleGo)
	rows := []Result{
		check("node/dns-flood-ls", len(ls) > 0 && p99(ls) < 100*time.Millisecond, "%s", figures),
		check("node/dns-flood-neighbour-create", len(create) > 0, "%s", figures),
		check("node/dns-flood-neighbour-exec", len(execs) > 0, "%s", figures),
	}
	if nodeCgroup {
		rows = append(rows, nodeCgroupRow(l.srv.Config.CgroupParent+"-node"))
	}
	judgeNode(t, backend, rows)
}

// ratio is p99(loaded) / p99(idle), 0 without samples.
func ratio(loaded, idle []time.Duration) float64 {
	if len(loaded) == 0 || p99(idle) == 0 {
		return 0
	}
	return float64(p99(loaded)) / float64(p99(idle))
}

func medianRatio(r []float64) float64 {
	if len(r) == 0 {
		return 0
	}
	s := slices.Clone(r)
	slices.Sort(s)
	return s[len(s)/2]
}

func roundRatios(r []float64) []string {
	out := make([]string, len(r))
	for i, x := range r {
		out[i] = strconv.FormatFloat(x, 'f', 2, 64)
	}
	return out
}

// runQueueWait is how long this process's threads (the daemon's, and the
// test's client) have been runnable without a CPU so far: the second
// field of /proc/self/task/*/schedstat.
func runQueueWait() time.Duration {
	ents, _ := os.ReadDir("/proc/self/task")
	var sum int64
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", e.Name(), "schedstat"))
		if f := strings.Fields(string(b)); err == nil && len(f) >= 2 {
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			sum += ns
		}
	}
	return time.Duration(sum)
}

// goRunnableWaits is the Go scheduler's histogram of how long goroutines
// of this process (the daemon's, and the test's client) waited runnable
// before they ran.
func goRunnableWaits() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return s[0].Value.Float64Histogram()
}

// goWaits sums the goroutine waits of several windows.
type goWaits struct {
	counts  []uint64
	buckets []float64
}

// add adds the waits between two readings of goRunnableWaits.
func (w *goWaits) add(before, after *metrics.Float64Histogram) {
	if before == nil || after == nil || len(before.Counts) != len(after.Counts) {
		return
	}
	if w.counts == nil {
		w.counts, w.buckets = make([]uint64, len(after.Counts)), after.Buckets
	}
	for i := range after.Counts {
		w.counts[i] += after.Counts[i] - before.Counts[i]
	}
}

// String is the waits' count, p99 and total time (each wait at its
// bucket's upper bound).
func (w goWaits) String() string {
	var n uint64
	for _, c := range w.counts {
		n += c
	}
	if n == 0 {
		return "none"
	}
	var seen uint64
	var sum, p99 float64
	for i, c := range w.counts {
		hi := w.buckets[i+1]
		if math.IsInf(hi, 1) {
			hi = w.buckets[i]
		}
		sum += float64(c) * hi
		if seen < n*99/100 && seen+c >= n*99/100 {
			p99 = hi
		}
		seen += c
	}
	return fmt.Sprintf("%d waits, p99 %v, total %v", n, time.Duration(p99*1e9).Round(time.Microsecond), time.Duration(sum*1e9).Round(time.Millisecond))
}

// loadAverage is the host's 1-minute load average (/proc/loadavg).
func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// nodeCgroupRow checks that the daemon (this process) runs in its node
// cgroup with a CPU weight far above the sandboxes' parent's.
func nodeCgroupRow(name string) Result {
	self, _ := os.ReadFile("/proc/self/cgroup")
	in := false
	for _, line := range strings.Split(string(self), "\n") {
		parts := strings.SplitN(line, ":", 3)
		in = in || (len(parts) == 3 && (parts[1] == "cpu" || parts[1] == "cpu,cpuacct" || parts[1] == "") && parts[2] == "/"+name)
	}
	weight := func(dir string) int {
		for _, f := range []string{"/sys/fs/cgroup/cpu/" + dir + "/cpu.shares", "/sys/fs/cgroup/cpu,cpuacct/" + dir + "/cpu.shares", "/sys/fs/cgroup/" + dir + "/cpu.weight"} {
			if b, err := os.ReadFile(f); err == nil {
				n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				return n
			}
		}
		return 0
	}
	parent := strings.TrimSuffix(name, "-node")
	node, sandboxes := weight(name), weight(parent)
	return check("node/own-cgroup", in && sandboxes > 0 && node >= 50*sandboxes,
		"daemon in /%s: %v; its CPU weight %d, the sandboxes' parent's %d", name, in, node, sandboxes)
}

// softirqTime is the host's softirq time so far, all CPUs (/proc/stat).
func softirqTime() time.Duration {
	b, _ := os.ReadFile("/proc/stat")
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq
	if len(f) < 8 {
		return 0
	}
	ticks, _ := strconv.ParseInt(f[7], 10, 64)
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}
