package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/runtime/osthread"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// minLearnedTTL keeps an answer's addresses allowed at least this long, so
// that a client that resolves and connects right away (TTL 0 answers) gets
// through.
const minLearnedTTL = 10 * time.Second

// maxLearnedTTL bounds how long one answer keeps an address open.
const maxLearnedTTL = time.Hour

// answerTypes are the query types the proxy forwards for an allowed name.
// TXT, NULL, MX and the rest are refused: they carry no address a sandbox
// connects to and are the usual channels of DNS tunnelling.
var answerTypes = map[uint16]bool{dns.TypeA: true, dns.TypeAAAA: true, dns.TypeCNAME: true, dns.TypeHTTPS: true, dns.TypeSVCB: true}

// dnsProxy is the node's resolver for sandboxes, listening on the bridge's
// gateway addresses: the only resolver a sandbox's programs let it reach.
type dnsProxy struct {
	m         *Manager
	ns        *os.File
	upstreams []string
	servers   []*dns.Server
	dials     chan dialReq // to the dialer thread in ns (nil: dial here)
	lim       *limiter
	log       *slog.Logger
}

// start listens on UDP and TCP port 53 of each gateway address, inside the
// node namespace.
func (p *dnsProxy) start(addrs []netip.Addr) error {
	if err := p.startDialer(); err != nil {
		return err
	}
	for _, a := range addrs {
		hostport := netip.AddrPortFrom(a, 53).String()
		var pc net.PacketConn
		var ln net.Listener
		err := InNetns(p.ns, func() error {
			var err error
			if pc, err = net.ListenPacket("udp", hostport); err != nil {
				return err
			}
			ln, err = net.Listen("tcp", hostport)
			return err
		})
		if err != nil {
			if pc != nil {
				pc.Close()
			}
			p.stop()
			return fmt.Errorf("dns proxy: listen on %s: %w", hostport, err)
		}
		rate := func(r dns.Reader) dns.Reader { return rateReader{Reader: r, p: p} }
		udp := &dns.Server{PacketConn: pc, Handler: p, DecorateReader: rate}
		tcp := &dns.Server{Listener: &limitedListener{Listener: ln, p: p}, Handler: p}
		for _, s := range []*dns.Server{udp, tcp} {
			p.servers = append(p.servers, s)
			started := make(chan struct{})
			s.NotifyStartedFunc = func() { close(started) }
			go func() { _ = s.ActivateAndServe() }()
			<-started
		}
	}
	return nil
}

func (p *dnsProxy) stop() {
	for _, s := range p.servers {
		_ = s.Shutdown()
	}
	p.servers = nil
	if p.dials != nil {
		close(p.dials)
		p.dials = nil
	}
}

type dialReq struct {
	ctx           context.Context
	network, addr string
	reply         chan<- dialRes
}

type dialRes struct {
	conn net.Conn
	err  error
}

// startDialer keeps one thread in the node namespace for the upstream UDP
// sockets: InNetns would make, and throw away, an OS thread per query.
func (p *dnsProxy) startDialer() error {
	if p.ns == nil {
		return nil
	}
	reqs := make(chan dialReq)
	errc := make(chan error, 1)
	// The thread ends with the goroutine; never the leader (see NewNetns).
	osthread.Go(func() {
		if err := unix.Setns(int(p.ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("dns proxy: enter node netns: %w", err)
			return
		}
		errc <- nil
		for r := range reqs {
			// A UDP dial only makes and connects a socket: it never waits.
			c, err := (&net.Dialer{}).DialContext(r.ctx, r.network, r.addr)
			r.reply <- dialRes{c, err}
		}
	})
	if err := <-errc; err != nil {
		return err
	}
	p.dials = reqs
	return nil
}

// dial opens a socket to an upstream from the node namespace.
func (p *dnsProxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if p.dials == nil || network != "udp" {
		var conn net.Conn
		err := InNetns(p.ns, func() error {
			var err error
			conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
	reply := make(chan dialRes, 1)
	p.dials <- dialReq{ctx, network, addr, reply}
	r := <-reply
	return r.conn, r.err
}

// ServeDNS answers one query of a sandbox, identified by its source
// address (a sandbox cannot change it: it has no CAP_NET_ADMIN).
func (p *dnsProxy) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	reply := func(rcode int) {
		m := new(dns.Msg)
		m.SetRcode(r, rcode)
		_ = w.WriteMsg(m)
	}
	sb := p.sandboxOf(w.RemoteAddr())
	if sb == nil || len(r.Question) != 1 || r.Opcode != dns.OpcodeQuery {
		reply(dns.RcodeRefused)
		return
	}
	// UDP queries met the rate in the reader already; TCP ones meet it
	// here. Over a limit a query gets no answer: a reply would be work.
	if _, udp := w.RemoteAddr().(*net.UDPAddr); !udp && !sb.limits.allow(time.Now(), &p.lim.cfg) {
		sb.limits.refuse(limitRate)
		return
	}
	if !acquire(&sb.limits.inFlight, p.lim.cfg.InFlight) {
		sb.limits.refuse(limitInFlight)
		return
	}
	defer sb.limits.inFlight.Add(-1)
	q := r.Question[0]
	name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
	entries := sb.nameEntries(name)
	// A name no rule lists gets no answer at all: no address to try, and
	// no channel out through the upstream resolver.
	if len(entries) == 0 || !answerTypes[q.Qtype] || q.Qclass != dns.ClassINET {
		sb.countRefusedName(name)
		reply(dns.RcodeRefused)
		return
	}
	if !acquire(&sb.limits.upstream, p.lim.cfg.Upstream) {
		sb.limits.refuse(limitUpstream)
		reply(dns.RcodeServerFailure)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := p.exchange(ctx, sb, r)
	sb.limits.upstream.Add(-1)
	if err != nil {
		p.lim.upstreamFailed(fmt.Errorf("%s: %w", name, err))
		reply(dns.RcodeServerFailure)
		return
	}
	resp.Answer = sb.learn(name, resp.Answer, entries)
	resp.Ns, resp.Extra = nil, nil
	resp.Id = r.Id
	_ = w.WriteMsg(resp)
}

// exchange asks the upstreams in turn, from the node namespace, each
// socket within the proxy's fd budget.
func (p *dnsProxy) exchange(ctx context.Context, sb *Sandbox, r *dns.Msg) (*dns.Msg, error) {
	q := r.Copy()
	q.Id = dns.Id()
	var errs []error
	for _, up := range p.upstreams {
		for _, network := range []string{"udp", "tcp"} {
			if !p.lim.takeFD() {
				sb.limits.refuse(limitFDs)
				return nil, errors.Join(append(errs, errors.New("dns proxy: fd budget spent"))...)
			}
			conn, err := p.dial(ctx, network, up)
			if err != nil {
				p.lim.putFD()
				errs = append(errs, err)
				break
			}
			dl, _ := ctx.Deadline()
			_ = conn.SetDeadline(dl)
			c := &dns.Conn{Conn: conn}
			err = c.WriteMsg(q)
			var resp *dns.Msg
			if err == nil {
				resp, err = c.ReadMsg()
			}
			conn.Close()
			p.lim.putFD()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", network, up, err))
				break
			}
			if resp.Truncated && network == "udp" {
				continue
			}
			return resp, nil
		}
	}
	return nil, errors.Join(errs...)
}

// answerAddr returns the address of an A or AAAA record.
func answerAddr(rr dns.RR) (netip.Addr, bool) {
	switch v := rr.(type) {
	case *dns.A:
		a, ok := netip.AddrFromSlice(v.A)
		return a.Unmap(), ok
	case *dns.AAAA:
		a, ok := netip.AddrFromSlice(v.AAAA)
		return a, ok
	}
	return netip.Addr{}, false
}
