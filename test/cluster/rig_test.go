// Package cluster_test runs a real cluster on one machine: a 3-member etcd
// (corral etcd processes), control instances and nodes as `corral serve
// --role control|node` processes with their own data dirs and cgroup
// parents (each node in a network namespace of its own where the test
// asks), real container sandboxes. Ports 17510-17539; namespaces cl14-t*,
// bridge crc14t, subnet 10.214.1.0/24. CORRAL_CLUSTER_TEST_PORT (a base
// port) and CORRAL_CLUSTER_TEST_TAG (two letters or digits replacing "14"
// in the names) and CORRAL_CLUSTER_TEST_SUBNET move a run aside of
// another on the same machine.
package cluster_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

var (
	portBase    = envInt("CORRAL_CLUSTER_TEST_PORT", 17510)
	etcdBase    = portBase      // 3 members: client +0/2/4, peer +1/3/5
	controlBase = portBase + 10 // control instances' TCP listeners
	nodeBase    = portBase + 20
	tag         = envOr("CORRAL_CLUSTER_TEST_TAG", "14")
)

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func envInt(key string, def int) int {
	n, err := strconv.Atoi(envOr(key, strconv.Itoa(def)))
	if err != nil {
		panic(fmt.Sprintf("%s: %v", key, err))
	}
	return n
}

type proc struct {
	name string
	exe  string // default the corral binary
	args []string
	cmd  *exec.Cmd
	log  string
}

type rig struct {
	t *testing.T
	// netns is set when every node runs in a network namespace of its own
	// (cl14-t<i>), joined to the host by the bridge crc14t.
	netns   bool
	host    string // address of etcd, as nodes reach it
	nodeIPs []string
	bin     string
	dir     string
	secret  string
	etcd    []*proc
	control []*proc
	nodes   []*proc
	nodeDir []string
	cgroups []string
	cli     []*client.Client
}

func (r *rig) start(p *proc) {
	r.t.Helper()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		r.t.Fatal(err)
	}
	exe := r.bin
	if p.exe != "" {
		exe = p.exe
	}
	p.cmd = exec.Command(exe, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		r.t.Fatalf("start %s: %v", p.name, err)
	}
	f.Close()
}

// kill9 kills p's process with SIGKILL, as a crash would.
func (r *rig) kill9(p *proc) {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_, _ = p.cmd.Process.Wait()
	p.cmd = nil
}

// stop ends p gracefully (a node with --cleanup-on-exit deletes its
// sandboxes).
func (r *rig) stop(p *proc) {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _, _ = p.cmd.Process.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		r.t.Errorf("%s did not stop in 90s; killing it", p.name)
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
	p.cmd = nil
}

func waitPort(t *testing.T, addr string, p *proc) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, _ := os.ReadFile(p.log)
	t.Fatalf("%s never listened on %s:\n%s", p.name, addr, b)
}

func (r *rig) endpoints() string {
	var eps []string
	for i := range 3 {
		eps = append(eps, fmt.Sprintf("http://%s:%d", r.host, etcdBase+2*i))
	}
	return strings.Join(eps, ",")
}

var (
	bridge = "crc" + tag + "t"
	subnet = envOr("CORRAL_CLUSTER_TEST_SUBNET", "10.214.1")
)

func sh(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
}

// nodeNetwork gives each of n nodes a network namespace with eth0 on a
// bridge of the host's; the host side (etcd) is subnet.1.
func (r *rig) nodeNetwork(n int) {
	t := r.t
	r.unnet(n) // leftovers of a killed run
	t.Cleanup(func() { r.unnet(n) })
	sh(t, "ip", "link", "add", bridge, "type", "bridge")
	sh(t, "ip", "addr", "add", subnet+".1/24", "dev", bridge)
	sh(t, "ip", "link", "set", bridge, "up")
	for i := range n {
		ns := fmt.Sprintf("cl%s-t%d", tag, i)
		sh(t, "ip", "netns", "add", ns)
		sh(t, "ip", "link", "add", fmt.Sprintf("cl%st%d", tag, i), "type", "veth", "peer", "name", "eth0", "netns", ns)
		sh(t, "ip", "link", "set", fmt.Sprintf("cl%st%d", tag, i), "master", bridge, "up")
		ip := fmt.Sprintf("%s.%d", subnet, 10+i)
		sh(t, "ip", "-n", ns, "addr", "add", ip+"/24", "dev", "eth0")
		sh(t, "ip", "-n", ns, "link", "set", "lo", "up")
		sh(t, "ip", "-n", ns, "link", "set", "eth0", "up")
		r.nodeIPs = append(r.nodeIPs, ip)
	}
	r.host = subnet + ".1"
}

func (r *rig) unnet(n int) {
	for i := range n {
		_ = exec.Command("ip", "netns", "del", fmt.Sprintf("cl%s-t%d", tag, i)).Run()
		_ = exec.Command("ip", "link", "del", fmt.Sprintf("cl%st%d", tag, i)).Run()
	}
	_ = exec.Command("ip", "link", "del", bridge).Run()
}

// nodeAddr is node i's cluster address.
func (r *rig) nodeAddr(i int) string {
	return fmt.Sprintf("%s:%d", r.nodeIPs[i], nodeBase+i)
}

// startRig starts 3 etcd members, nControl control instances and nNode
// nodes, and waits until the first control instance sees every node.
func startRig(t *testing.T, netns bool, nControl, nNode int, nodeArgs ...string) *rig {
	return startRigOpts(t, rigOpts{netns: netns, nControl: nControl, nNode: nNode, nodeArgs: nodeArgs})
}

// rigOpts are startRig's, and: arguments for every control instance, and
// whether nodes and control instances go without the cluster secret (their
// arguments must then authenticate them).
type rigOpts struct {
	netns           bool
	nControl, nNode int
	nodeArgs        []string
	controlArgs     []string
	noSecret        bool
}

func startRigOpts(t *testing.T, o rigOpts) *rig {
	netns, nControl, nNode, nodeArgs := o.netns, o.nControl, o.nNode, o.nodeArgs
	testenv.RequireRoot(t)
	r := &rig{t: t, netns: netns, host: "127.0.0.1", bin: filepath.Join(testenv.Binaries(t), "corral"), dir: t.TempDir(), secret: "cluster-test-secret-" + testenv.UniqueName("s")}
	if netns {
		r.nodeNetwork(nNode)
	} else {
		for range nNode {
			r.nodeIPs = append(r.nodeIPs, "127.0.0.1")
		}
	}
	sf := filepath.Join(r.dir, "secret")
	if err := os.WriteFile(sf, []byte(r.secret), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.cleanup)
	var initial []string
	for i := range 3 {
		initial = append(initial, fmt.Sprintf("m%d=http://%s:%d", i, r.host, etcdBase+2*i+1))
	}
	for i := range 3 {
		p := &proc{name: fmt.Sprintf("etcd m%d", i), log: filepath.Join(r.dir, fmt.Sprintf("etcd%d.log", i)), args: []string{"etcd",
			"--name", fmt.Sprintf("m%d", i), "--data-dir", filepath.Join(r.dir, fmt.Sprintf("etcd%d", i)),
			"--client-url", fmt.Sprintf("http://%s:%d", r.host, etcdBase+2*i),
			"--peer-url", fmt.Sprintf("http://%s:%d", r.host, etcdBase+2*i+1),
			"--initial-cluster", strings.Join(initial, ","), "--no-fsync"}}
		r.start(p)
		r.etcd = append(r.etcd, p)
	}
	for i, p := range r.etcd {
		waitPort(t, fmt.Sprintf("%s:%d", r.host, etcdBase+2*i), p)
	}
	for i := range nNode {
		dir := filepath.Join(r.dir, fmt.Sprintf("node%d", i))
		cg := testenv.UniqueName("corral-t14-node")
		r.nodeDir, r.cgroups = append(r.nodeDir, dir), append(r.cgroups, cg)
		p := &proc{name: fmt.Sprintf("node %d", i), log: filepath.Join(r.dir, fmt.Sprintf("node%d.log", i)), args: []string{"serve",
			"--role", "node", "--etcd", r.endpoints(), "--cluster-secret-file", sf,
			"--advertise", r.nodeAddr(i), "--data-dir", dir, "--listen", "",
			"--cgroup-parent", cg, "--net-bridge", fmt.Sprintf("crc%sn%d", tag, i), "--lease-ttl", "3s",
			"--report-interval", "500ms", "--cleanup-on-exit", "--log-level", "warn", "--no-raise-limits",
			"--node-label", fmt.Sprintf("rack=r%d", i)}}
		p.args = append(p.args, nodeArgs...)
		if o.noSecret {
			p.args = withoutSecret(p.args)
		}
		if netns {
			// nsenter, not `ip netns exec`, which remounts /sys and so
			// hides the cgroup hierarchies; it execs corral in place, so
			// a SIGKILL reaches the node itself.
			p.args = append([]string{"--net=/run/netns/" + fmt.Sprintf("cl%s-t%d", tag, i), r.bin}, p.args...)
			p.exe = "nsenter"
		}
		r.start(p)
		r.nodes = append(r.nodes, p)
	}
	for i := range nControl {
		addr := fmt.Sprintf("127.0.0.1:%d", controlBase+i)
		// The tests drive the cluster as its administrator, on the
		// socket; TCP callers need a token.
		sock := r.controlSocket(i)
		p := &proc{name: fmt.Sprintf("control %d", i), log: filepath.Join(r.dir, fmt.Sprintf("control%d.log", i)), args: []string{"serve",
			"--role", "control", "--etcd", r.endpoints(), "--cluster-secret-file", sf, "--listen", addr, "--socket", sock, "--log-level", "warn"}}
		p.args = append(p.args, o.controlArgs...)
		if o.noSecret {
			p.args = withoutSecret(p.args)
		}
		r.start(p)
		r.control = append(r.control, p)
		waitPort(t, addr, p)
		c, err := client.New("unix://" + sock)
		if err != nil {
			t.Fatal(err)
		}
		r.cli = append(r.cli, c)
	}
	for i, p := range r.nodes {
		waitPort(t, r.nodeAddr(i), p)
	}
	r.waitNodes(nNode, "ready")
	return r
}

// withoutSecret drops --cluster-secret-file and its value from args.
func withoutSecret(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--cluster-secret-file" {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// projectToken makes project with quota through admin and returns the
// secret of a new token of it.
func projectToken(t *testing.T, admin *client.Client, project string, quota client.Quota) string {
	t.Helper()
	ctx := context.Background()
	if _, err := admin.CreateProject(ctx, project, quota); err != nil {
		t.Fatal(err)
	}
	_, secret, err := admin.CreateToken(ctx, client.TokenOptions{Project: project})
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

// controlSocket is control instance i's unix socket.
func (r *rig) controlSocket(i int) string {
	return filepath.Join(r.dir, fmt.Sprintf("control%d.sock", i))
}

// waitNodes waits until every control instance reports n nodes in state,
// and returns control 0's list.
func (r *rig) waitNodes(n int, state string) []client.Node {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		// Each control instance watches the cluster on its own: every one
		// must see the nodes before a test places through it.
		var first []client.Node
		var err error
		for i, c := range r.cli {
			nodes, cerr := c.ClusterNodes(context.Background())
			if i == 0 {
				first = nodes
			}
			if k := countState(nodes, state); cerr == nil && k != n {
				cerr = fmt.Errorf("control instance %d sees %d %s", i, k, state)
			}
			if cerr != nil {
				err = cerr
				break
			}
		}
		if err == nil {
			return first
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("nodes never reached %d %s: %+v, %v", n, state, first, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func countState(nodes []client.Node, state string) int {
	k := 0
	for _, nd := range nodes {
		if nd.State == state {
			k++
		}
	}
	return k
}

func (r *rig) cleanup() {
	for _, c := range r.cli {
		c.Close()
	}
	for _, p := range r.nodes {
		r.stop(p)
	}
	for _, p := range r.control {
		r.stop(p)
	}
	for _, p := range r.etcd {
		r.stop(p)
	}
	for i, dir := range r.nodeDir {
		testenv.AssertNoLeaks(r.t, dir, r.cgroups[i])
		testenv.RemoveCgroupParent(r.cgroups[i])
	}
	if r.t.Failed() {
		for _, p := range append(append(append([]*proc{}, r.etcd...), r.control...), r.nodes...) {
			b, _ := os.ReadFile(p.log)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			r.t.Logf("--- %s log (tail):\n%s", p.name, b)
		}
	}
}
