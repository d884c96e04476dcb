// Package netlab builds a small private internet on this machine for the
// network tests and the net benchmark: a "node" network namespace (the
// node's side of sandbox networking, so that the host's own interfaces,
// routes and forwarding settings are never touched) linked by a veth pair to
// an "internet" namespace whose hosts live on benchmark (198.18.0.0/15) and
// documentation (2001:db8::/32) addresses: a fake PyPI, a fake npm, a host
// no rule allows, and an upstream DNS server that resolves their names.
// Everything goes with Close. It imports netpolicy only for its namespace
// helpers.
package netlab

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"

	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Hosts of the lab internet.
var (
	PyPI4   = netip.MustParseAddr("198.18.1.10")
	PyPI6   = netip.MustParseAddr("2001:db8:1::10")
	NPM4    = netip.MustParseAddr("198.18.1.20")
	NPM6    = netip.MustParseAddr("2001:db8:1::20")
	Denied4 = netip.MustParseAddr("198.18.1.30")
	Denied6 = netip.MustParseAddr("2001:db8:1::30")
	DNS4    = netip.MustParseAddr("198.18.1.53")
	// NodeUplink4 is the node namespace's own address toward the lab.
	NodeUplink4 = netip.MustParseAddr("198.18.0.2")
)

// Names the lab DNS server answers.
var Names = map[string][]netip.Addr{
	"pypi.test":        {PyPI4, PyPI6},
	"files.pypi.test":  {PyPI4},
	"npm.test":         {NPM4, NPM6},
	"denied.test":      {Denied4, Denied6},
	"rebind.pypi.test": {netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("169.254.169.254")},
}

// Ports the lab hosts serve: HTTP on both, a UDP echo on UDPPort.
const (
	HTTPPort    = 80
	AltHTTPPort = 8080
	UDPPort     = 9999
)

// Lab is a running lab.
type Lab struct {
	// Node is the node namespace; NodePath opens it (Config.NodeNetns).
	Node     *os.File
	NodePath string
	Internet *os.File
	closers  []io.Closer
	wg       sync.WaitGroup
}

// New builds the lab. Its veth pair lives only in the lab's own
// namespaces, so concurrent labs never collide.
func New() (l *Lab, err error) {
	l = &Lab{}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if l.Node, err = netpolicy.NewNetns(); err != nil {
		return nil, err
	}
	l.NodePath = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), l.Node.Fd())
	if l.Internet, err = netpolicy.NewNetns(); err != nil {
		return nil, err
	}
	if err := l.wire(); err != nil {
		return nil, fmt.Errorf("netlab: %w", err)
	}
	if err := l.serve(); err != nil {
		return nil, fmt.Errorf("netlab: %w", err)
	}
	return l, nil
}

func handle(ns *os.File) (*netlink.Handle, error) {
	return netlink.NewHandleAt(netns.NsHandle(int(ns.Fd())))
}

func addr(h *netlink.Handle, l netlink.Link, p string) error {
	a, err := netlink.ParseAddr(p)
	if err != nil {
		return err
	}
	a.Flags = unix.IFA_F_NODAD
	return h.AddrAdd(l, a)
}

// wire links node and internet: uplink 198.18.0.2 <-> 198.18.0.1, the
// internet's hosts on its loopback, the node's default routes toward it.
func (l *Lab) wire() error {
	node, err := handle(l.Node)
	if err != nil {
		return err
	}
	defer node.Close()
	inet, err := handle(l.Internet)
	if err != nil {
		return err
	}
	defer inet.Close()
	la := netlink.NewLinkAttrs()
	la.Name = "uplink"
	if err := node.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "downlink", PeerNamespace: netlink.NsFd(int(l.Internet.Fd()))}); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	up, err := node.LinkByName("uplink")
	if err != nil {
		return err
	}
	down, err := inet.LinkByName("downlink")
	if err != nil {
		return err
	}
	for _, s := range []struct {
		h    *netlink.Handle
		link netlink.Link
		cidr []string
	}{
		{node, up, []string{"198.18.0.2/24", "2001:db8::2/64"}},
		{inet, down, []string{"198.18.0.1/24", "2001:db8::1/64"}},
	} {
		for _, c := range s.cidr {
			if err := addr(s.h, s.link, c); err != nil {
				return fmt.Errorf("address %s: %w", c, err)
			}
		}
		if err := s.h.LinkSetUp(s.link); err != nil {
			return err
		}
	}
	for _, h := range []*netlink.Handle{node, inet} {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(lo); err != nil {
			return err
		}
	}
	lo, _ := inet.LinkByName("lo")
	for _, a := range []netip.Addr{PyPI4, PyPI6, NPM4, NPM6, Denied4, Denied6, DNS4} {
		if err := addr(inet, lo, netip.PrefixFrom(a, a.BitLen()).String()); err != nil {
			return fmt.Errorf("host address %s: %w", a, err)
		}
	}
	for _, gw := range []string{"198.18.0.1", "2001:db8::1"} {
		if err := node.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: net.ParseIP(gw)}); err != nil {
			return fmt.Errorf("node route via %s: %w", gw, err)
		}
	}
	return nil
}

// serve starts the lab's servers inside the internet namespace.
func (l *Lab) serve() error {
	var lns []net.Listener
	var udps []net.PacketConn
	var dnsUDP net.PacketConn
	err := netpolicy.InNetns(l.Internet, func() error {
		// One listener per family: Go decides once per process whether
		// ":80" is dual-stack, probing in whatever namespace its first
		// socket was made, which may have had no IPv6 loopback yet.
		for _, p := range []int{HTTPPort, AltHTTPPort} {
			for _, fam := range []string{"tcp4", "tcp6"} {
				ln, err := net.Listen(fam, fmt.Sprintf(":%d", p))
				if err != nil {
					return err
				}
				lns = append(lns, ln)
			}
		}
		// One echo socket per host address: a reply must come from the
		// address the query went to, or the node's NAT cannot match it.
		for _, a := range []netip.Addr{PyPI4, PyPI6, NPM4, NPM6, Denied4, Denied6} {
			pc, err := net.ListenPacket("udp", netip.AddrPortFrom(a, UDPPort).String())
			if err != nil {
				return err
			}
			udps = append(udps, pc)
		}
		var err error
		dnsUDP, err = net.ListenPacket("udp", netip.AddrPortFrom(DNS4, 53).String())
		return err
	})
	if err != nil {
		for _, ln := range lns {
			ln.Close()
		}
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Each host says who it is, so a test sees where it got.
		host, _, _ := net.SplitHostPort(r.Context().Value(http.LocalAddrContextKey).(net.Addr).String())
		fmt.Fprintf(w, "lab host %s\n", host)
	})}
	for _, ln := range lns {
		l.wg.Add(1)
		go func() { defer l.wg.Done(); _ = srv.Serve(ln) }()
	}
	l.closers = append(l.closers, srv)
	for _, udp := range udps {
		l.closers = append(l.closers, udp)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			buf := make([]byte, 2048)
			for {
				n, from, err := udp.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = udp.WriteTo(buf[:n], from)
			}
		}()
	}
	ds := &dns.Server{PacketConn: dnsUDP, Handler: dns.HandlerFunc(answer)}
	started := make(chan struct{})
	ds.NotifyStartedFunc = func() { close(started) }
	l.wg.Add(1)
	go func() { defer l.wg.Done(); _ = ds.ActivateAndServe() }()
	<-started
	l.closers = append(l.closers, closerFunc(ds.Shutdown))
	return nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// answer is the lab's authoritative DNS: Names, TTL 60.
func answer(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	for _, q := range r.Question {
		name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
		addrs, ok := Names[name]
		if !ok {
			m.Rcode = dns.RcodeNameError
			continue
		}
		for _, a := range addrs {
			hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 60}
			switch {
			case a.Is4() && q.Qtype == dns.TypeA:
				hdr.Rrtype = dns.TypeA
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
			case a.Is6() && q.Qtype == dns.TypeAAAA:
				hdr.Rrtype = dns.TypeAAAA
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
			}
		}
		if q.Qtype == dns.TypeTXT {
			m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}, Txt: []string{"tunnel"}})
		}
	}
	_ = w.WriteMsg(m)
}

// Listen opens a TCP listener inside the node namespace (a service of the
// node a sandbox must not reach).
func (l *Lab) Listen(addr string) (net.Listener, error) {
	var ln net.Listener
	err := netpolicy.InNetns(l.Node, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// SandboxVeths lists the node-side veths of sandbox network slots (the
// "cr" names netpolicy gives them) in the node namespace: what a test
// checks for leaks.
func (l *Lab) SandboxVeths() ([]string, error) {
	var out []string
	err := netpolicy.InNetns(l.Node, func() error {
		ifs, err := net.Interfaces()
		for _, i := range ifs {
			if strings.HasPrefix(i.Name, "cr") {
				out = append(out, i.Name)
			}
		}
		return err
	})
	return out, err
}

// Close stops the servers and drops both namespaces (and with them the
// veth pair).
func (l *Lab) Close() error {
	var errs []error
	for _, c := range l.closers {
		if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	l.wg.Wait()
	for _, f := range []*os.File{l.Node, l.Internet} {
		if f != nil {
			f.Close()
		}
	}
	return errors.Join(errs...)
}
