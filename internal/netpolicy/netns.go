package netpolicy

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"

	"github.com/corral-dev/corral/internal/runtime/osthread"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// newNetns makes a network namespace and returns a handle on it. Only the
// handle (and later the sandbox's processes) keeps it alive: nothing is
// bind-mounted, so a crashed daemon leaks no namespace, and its veth pair
// goes with it.
func NewNetns() (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	res := make(chan result, 1)
	// A thread of its own, never unlocked: Go ends it with the goroutine,
	// so no other goroutine ever runs in the new namespace. Never the
	// thread group leader, which Go would keep, parked in the namespace,
	// and whose namespace /proc/<daemon>/net shows.
	osthread.Go(func() {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			res <- result{err: fmt.Errorf("unshare net: %w", err)}
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		res <- result{f, err}
	})
	r := <-res
	return r.f, r.err
}

// inNetns runs fn on a thread inside the namespace ns (nil: the current
// one). Sockets fn opens stay in that namespace.
func InNetns(ns *os.File, fn func() error) error {
	if ns == nil {
		return fn()
	}
	// A thread that entered another namespace is thrown away with its
	// goroutine instead of going back to the pool (osthread: as NewNetns).
	return osthread.Run(func() error {
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter netns: %w", err)
		}
		return fn()
	})
}

// handleIn is a netlink handle working in ns (nil: the current namespace).
func handleIn(ns *os.File) (*netlink.Handle, error) {
	if ns == nil {
		return netlink.NewHandle()
	}
	return netlink.NewHandleAt(netns.NsHandle(int(ns.Fd())))
}

func writeSysctl(path, val string) error {
	if err := os.WriteFile(path, []byte(val), 0); err != nil {
		return fmt.Errorf("sysctl %s: %w", path, err)
	}
	return nil
}

// nodeSide is the node's end: the bridge every sandbox's veth joins, its
// gateway addresses (where the DNS proxy listens) and the NAT.
type nodeSide struct {
	ns      *os.File // node namespace (nil: the daemon's)
	nl      *netlink.Handle
	bridge  string
	gw4     netip.Prefix
	gw6     netip.Prefix
	brIndex int
	ctLimit int       // conntrack entries per sandbox address
	dns     DNSLimits // the proxy's, for the kernel-side rate
}

// setUp creates (or adopts) the bridge, turns on forwarding in the node
// namespace and installs the masquerade rule.
func (n *nodeSide) setUp() error {
	br, err := n.nl.LinkByName(n.bridge)
	if err != nil {
		la := netlink.NewLinkAttrs()
		la.Name = n.bridge
		// A fixed address: otherwise the bridge takes the lowest of its
		// ports' addresses, which changes as ports come and go and leaves
		// the sandboxes' neighbour entries for the gateway stale.
		la.HardwareAddr = bridgeMAC(n.bridge)
		if err := n.nl.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create bridge %s: %w", n.bridge, err)
		}
		if br, err = n.nl.LinkByName(n.bridge); err != nil {
			return fmt.Errorf("bridge %s: %w", n.bridge, err)
		}
	}
	if br.Type() != "bridge" {
		return fmt.Errorf("%s exists and is a %s, not a bridge", n.bridge, br.Type())
	}
	n.brIndex = br.Attrs().Index
	err = InNetns(n.ns, func() error {
		return writeSysctl("/proc/sys/net/ipv6/conf/"+n.bridge+"/accept_dad", "0")
	})
	if err != nil {
		return err
	}
	for _, p := range []netip.Prefix{n.gw4, n.gw6} {
		a := &netlink.Addr{IPNet: ipNet(p), Flags: unix.IFA_F_NODAD}
		if err := n.nl.AddrReplace(br, a); err != nil {
			return fmt.Errorf("bridge %s: address %s: %w", n.bridge, p, err)
		}
	}
	if err := n.nl.LinkSetUp(br); err != nil {
		return fmt.Errorf("bridge %s: up: %w", n.bridge, err)
	}
	// Routing sandbox traffic is the node's job; these are the only host
	// settings corral changes (in NodeNetns when one is configured).
	err = InNetns(n.ns, func() error {
		return errors.Join(
			writeSysctl("/proc/sys/net/ipv4/ip_forward", "1"),
			writeSysctl("/proc/sys/net/ipv6/conf/all/forwarding", "1"))
	})
	if err != nil {
		return err
	}
	return n.setNAT()
}

func (n *nodeSide) table() *nftables.Table {
	return &nftables.Table{Name: "corral_" + n.bridge, Family: nftables.TableFamilyINet}
}

func (n *nodeSide) nft() (*nftables.Conn, error) {
	if n.ns == nil {
		return nftables.New()
	}
	return nftables.New(nftables.WithNetNSFd(int(n.ns.Fd())))
}

// setNAT (re)creates table inet corral_<bridge>: sandbox traffic leaving
// through any other interface is masqueraded, new connections from
// outside into the sandboxes are dropped (a sandbox serves nobody), and
// the per-sandbox caps on conntrack entries and DNS packets hold.
func (n *nodeSide) setNAT() error {
	c, err := n.nft()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := n.table()
	c.DelTable(t)
	_ = c.Flush() // absent is fine
	c.AddTable(t)
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	br := ifname(n.bridge)
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br},
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: br},
		&expr.Masq{},
	}})
	drop := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br},
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: nativeU32(expr.CtStateBitNEW), Xor: nativeU32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: nativeU32(0)},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	if err := addSourceCaps(c, t, fwd, br, n.ctLimit, n.dns); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: install table %s: %w", t.Name, err)
	}
	return nil
}

// tearDown removes the NAT table and the bridge.
func (n *nodeSide) tearDown() error {
	var errs []error
	if c, err := n.nft(); err == nil {
		c.DelTable(n.table())
		if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("nftables: remove table: %w", err))
		}
	}
	if br, err := n.nl.LinkByName(n.bridge); err == nil {
		if err := n.nl.LinkDel(br); err != nil {
			errs = append(errs, fmt.Errorf("remove bridge %s: %w", n.bridge, err))
		}
	}
	return errors.Join(errs...)
}

// ports lists the names of the bridge's ports (host ends of veths).
func (n *nodeSide) ports() ([]string, error) {
	links, err := n.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().MasterIndex == n.brIndex && l.Type() == "veth" {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

// addresses lists every address of the node namespace.
func (n *nodeSide) addresses() ([]netip.Prefix, error) {
	addrs, err := n.nl.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list node addresses: %w", err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if ok {
			ip = ip.Unmap()
			out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	return out, nil
}

func (n *nodeSide) deleteLink(name string) error {
	l, err := n.nl.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := n.nl.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// slot is a sandbox network namespace wired to the bridge, with its
// programs loaded but not attached: what the pool keeps ready.
type slot struct {
	ns       *os.File
	hostVeth string
	index    uint32
	addr4    netip.Addr
	addr6    netip.Addr
	filter   *filter
	linked   bool // the veth pair is this slot's (created by it)
}

// makeSlot creates the namespace, the veth pair (eth0 inside), addresses,
// routes, and loads the programs. On error nothing of it remains.
func (n *nodeSide) makeSlot(index uint32, addr4, addr6 netip.Addr, vethName string) (*slot, error) {
	s := &slot{hostVeth: vethName, index: index, addr4: addr4, addr6: addr6}
	if err := n.wireSlot(s); err != nil {
		s.destroy(n)
		return nil, err
	}
	return s, nil
}

func (n *nodeSide) wireSlot(s *slot) (err error) {
	vethName, addr4, addr6 := s.hostVeth, s.addr4, s.addr6
	if s.ns, err = NewNetns(); err != nil {
		return err
	}
	err = InNetns(s.ns, func() error {
		return errors.Join(
			// Ping sockets for every group: ICMP echo is then a policy
			// decision of the programs, not a missing capability.
			writeSysctl("/proc/sys/net/ipv4/ping_group_range", "0 2147483647"),
			// No duplicate address detection on a link with one peer: a
			// first IPv6 packet must not wait for it.
			writeSysctl("/proc/sys/net/ipv6/conf/default/accept_dad", "0"),
			writeSysctl("/proc/sys/net/ipv6/conf/all/accept_dad", "0"))
	})
	if err != nil {
		return err
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.MasterIndex = vethName, n.brIndex
	veth := &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(s.ns.Fd()))}
	if err = n.nl.LinkAdd(veth); err != nil {
		// EEXIST: the name is another sandbox's; it is not ours to remove.
		return fmt.Errorf("create veth %s: %w", vethName, err)
	}
	s.linked = true
	// A bridge port needs no addresses of its own.
	err = InNetns(n.ns, func() error {
		return writeSysctl("/proc/sys/net/ipv6/conf/"+vethName+"/disable_ipv6", "1")
	})
	if err != nil {
		return err
	}
	if err = n.nl.LinkSetUp(veth); err != nil {
		return fmt.Errorf("veth %s up: %w", vethName, err)
	}
	in, err := handleIn(s.ns)
	if err != nil {
		return fmt.Errorf("netlink in sandbox netns: %w", err)
	}
	defer in.Close()
	lo, err := in.LinkByName("lo")
	if err == nil {
		err = in.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("sandbox lo: %w", err)
	}
	eth, err := in.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("sandbox eth0: %w", err)
	}
	for _, p := range []netip.Prefix{netip.PrefixFrom(addr4, n.gw4.Bits()), netip.PrefixFrom(addr6, n.gw6.Bits())} {
		if err = in.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(p), Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("sandbox eth0 address %s: %w", p, err)
		}
	}
	if err = in.LinkSetUp(eth); err != nil {
		return fmt.Errorf("sandbox eth0 up: %w", err)
	}
	for _, gw := range []netip.Addr{n.gw4.Addr(), n.gw6.Addr()} {
		r := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(gw.AsSlice())}
		if err = in.RouteAdd(r); err != nil {
			return fmt.Errorf("sandbox default route via %s: %w", gw, err)
		}
	}
	if err = addSenderRate(s.ns, n.gw4.Addr(), n.gw6.Addr(), n.dns); err != nil {
		return err
	}
	s.filter, err = loadFilter()
	return err
}

// destroy removes the veth pair and drops the namespace handle.
func (s *slot) destroy(n *nodeSide) error {
	var err error
	if s.linked {
		err = n.deleteLink(s.hostVeth)
	}
	if s.ns != nil {
		s.ns.Close()
	}
	if s.filter != nil {
		s.filter.close()
	}
	return err
}

// bridgeMAC is a locally administered unicast address derived from name.
func bridgeMAC(name string) net.HardwareAddr {
	h := fnv.New32a()
	h.Write([]byte(name))
	v := h.Sum32()
	return net.HardwareAddr{0x02, 0x63, byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func ifname(s string) []byte {
	b := make([]byte, 16)
	copy(b, s)
	return b
}

func nativeU32(v uint32) []byte {
	b := make([]byte, 4)
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	return b
}
