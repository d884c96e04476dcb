package netpolicy

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// DNSLimits bound what one sandbox may make the node's DNS proxy do. The
// proxy runs in the daemon, so without them one sandbox could hold the
// daemon's file descriptors (a TCP connection or an upstream socket each)
// and spend the daemon's CPU for free. Zero fields take the defaults.
type DNSLimits struct {
	// TCPConns is how many TCP connections one sandbox may hold open to
	// the proxy (default 16).
	TCPConns int
	// InFlight is how many of one sandbox's queries may be answered at
	// once (default 64).
	InFlight int
	// Upstream is how many of one sandbox's queries may wait on the
	// upstream resolvers at once (default 16).
	Upstream int
	// Rate and Burst are one sandbox's token bucket, in queries per second
	// (default 100, burst 200): a query beyond it is dropped before it is
	// parsed, so a flood costs the daemon a receive and a map lookup.
	Rate, Burst float64
	// FDs is the proxy's hard budget of file descriptors, over every
	// sandbox: TCP connections plus upstream sockets (default a quarter
	// of the daemon's RLIMIT_NOFILE, between 64 and 4096). The rest stays
	// for the API, the sandboxes' channels and the stores.
	FDs int
}

func (l DNSLimits) withDefaults() DNSLimits {
	if l.TCPConns <= 0 {
		l.TCPConns = 16
	}
	if l.InFlight <= 0 {
		l.InFlight = 64
	}
	if l.Upstream <= 0 {
		l.Upstream = 16
	}
	if l.Rate <= 0 {
		l.Rate = 100
	}
	if l.Burst < 1 {
		l.Burst = 2 * l.Rate
	}
	if l.FDs <= 0 {
		l.FDs = 1024
		var rl unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur != unix.RLIM_INFINITY {
			l.FDs = int(min(max(rl.Cur/4, 64), 4096))
		}
	}
	return l
}

// Reasons a query or connection is refused beyond a limit; each is counted
// per sandbox and reported as a refusal with hook "limit".
const (
	limitTCPConns = iota // dns-tcp-conns
	limitInFlight        // dns-in-flight
	limitRate            // dns-rate
	limitUpstream        // dns-upstream
	limitFDs             // dns-fd-budget: the node-wide budget was spent
	limitLearned         // dns-learned: the sandbox's learned-address set is full
	numLimits
)

var limitNames = [numLimits]string{"dns-tcp-conns", "dns-in-flight", "dns-rate", "dns-upstream", "dns-fd-budget", "dns-learned"}

// sandboxLimits is one sandbox's share of the proxy.
type sandboxLimits struct {
	tcp      atomic.Int64
	inFlight atomic.Int64
	upstream atomic.Int64
	refused  [numLimits]atomic.Uint64
	logged   [numLimits]uint64 // refused at the last summary line (under limiter.mu)

	mu     sync.Mutex
	tokens float64
	last   time.Time
}

// allow takes one token of the bucket.
func (s *sandboxLimits) allow(now time.Time, l *DNSLimits) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last.IsZero() {
		s.tokens = l.Burst
	} else {
		s.tokens = min(l.Burst, s.tokens+now.Sub(s.last).Seconds()*l.Rate)
	}
	s.last = now
	if s.tokens < 1 {
		return false
	}
	s.tokens--
	return true
}

// acquire adds one to c unless that passes max.
func acquire(c *atomic.Int64, max int) bool {
	if c.Add(1) > int64(max) {
		c.Add(-1)
		return false
	}
	return true
}

func (s *sandboxLimits) refuse(reason int) { s.refused[reason].Add(1) }

// counts are the refusals so far, by reason name (nonzero only).
func (s *sandboxLimits) counts() map[string]uint64 {
	out := map[string]uint64{}
	for i := range s.refused {
		if n := s.refused[i].Load(); n > 0 {
			out[limitNames[i]] = n
		}
	}
	return out
}

// limiter is the proxy's side of the limits: the node-wide fd budget and
// the summary log. The proxy stays in the daemon's process (it writes a
// sandbox's eBPF maps, held by the daemon, before it answers; a process of
// its own would need every map handed over and a round trip per answer),
// so its descriptors are bounded by a budget of their own, well below
// RLIMIT_NOFILE: however many sandboxes flood it, the API keeps the rest.
type limiter struct {
	cfg DNSLimits
	fds atomic.Int64
	log *slog.Logger

	mu          sync.Mutex
	upFails     uint64 // upstream failures since the last summary
	lastUpErr   error
	acceptFails uint64
}

func newLimiter(cfg DNSLimits, log *slog.Logger) *limiter {
	return &limiter{cfg: cfg.withDefaults(), log: log}
}

func (l *limiter) takeFD() bool { return acquire(&l.fds, l.cfg.FDs) }
func (l *limiter) putFD()       { l.fds.Add(-1) }

func (l *limiter) upstreamFailed(err error) {
	l.mu.Lock()
	l.upFails++
	l.lastUpErr = err
	l.mu.Unlock()
}

// summarize logs, at most once per call (the manager calls it every
// summaryInterval), one line per sandbox that was refused since the last
// line and one for upstream failures: never a line per query.
func (l *limiter) summarize(sbs []*Sandbox) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.upFails > 0 {
		l.log.Warn("dns proxy: upstream failures", "count", l.upFails, "last_err", l.lastUpErr)
		l.upFails, l.lastUpErr = 0, nil
	}
	if l.acceptFails > 0 {
		l.log.Warn("dns proxy: accept failed", "count", l.acceptFails)
		l.acceptFails = 0
	}
	for _, sb := range sbs {
		var attrs []any
		for i := range sb.limits.refused {
			n := sb.limits.refused[i].Load()
			if d := n - sb.limits.logged[i]; d > 0 {
				attrs = append(attrs, limitNames[i], d)
				sb.limits.logged[i] = n
			}
		}
		if len(attrs) > 0 {
			l.log.Warn("dns proxy: sandbox over its limits", append([]any{"sandbox", sb.id}, attrs...)...)
		}
	}
}

// summaryInterval is how often the limit summaries are logged.
const summaryInterval = 10 * time.Second

// limitedListener admits a TCP connection only for a known sandbox under
// its connection limit and within the proxy's fd budget; any other is
// closed at once.
type limitedListener struct {
	net.Listener
	p *dnsProxy
}

func (ln *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
				// The daemon as a whole is out of fds: back off instead of
				// spinning (the connection waits in the backlog).
				ln.p.lim.mu.Lock()
				ln.p.lim.acceptFails++
				ln.p.lim.mu.Unlock()
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return nil, err
		}
		sb := ln.p.sandboxOf(c.RemoteAddr())
		switch {
		case sb == nil:
			c.Close()
		case !ln.p.lim.takeFD():
			sb.limits.refuse(limitFDs)
			c.Close()
		case !acquire(&sb.limits.tcp, ln.p.lim.cfg.TCPConns):
			ln.p.lim.putFD()
			sb.limits.refuse(limitTCPConns)
			c.Close()
		default:
			return &limitedConn{Conn: c, release: func() { sb.limits.tcp.Add(-1); ln.p.lim.putFD() }}, nil
		}
	}
}

// limitedConn gives its slot back once, on Close.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// rateReader drops a UDP query over its sandbox's rate before the server
// parses it or starts a goroutine for it; queries from unknown sources
// are dropped too.
type rateReader struct {
	dns.Reader
	p *dnsProxy
}

func (r rateReader) ReadUDP(conn *net.UDPConn, timeout time.Duration) ([]byte, *dns.SessionUDP, error) {
	for {
		m, s, err := r.Reader.ReadUDP(conn, timeout)
		if err != nil {
			return m, s, err
		}
		sb := r.p.sandboxOf(s.RemoteAddr())
		if sb == nil {
			continue
		}
		if !sb.limits.allow(time.Now(), &r.p.lim.cfg) {
			sb.limits.refuse(limitRate)
			continue
		}
		return m, s, nil
	}
}

func (r rateReader) ReadPacketConn(conn net.PacketConn, timeout time.Duration) ([]byte, net.Addr, error) {
	pr, ok := r.Reader.(dns.PacketConnReader)
	if !ok {
		return nil, nil, fmt.Errorf("dns proxy: reader cannot read a packet conn")
	}
	return pr.ReadPacketConn(conn, timeout)
}

// sandboxOf finds the sandbox by a query's source address.
func (p *dnsProxy) sandboxOf(a net.Addr) *Sandbox {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.UDPAddr:
		ap = a.AddrPort()
	case *net.TCPAddr:
		ap = a.AddrPort()
	default:
		return nil
	}
	return p.m.bySource(ap.Addr().Unmap())
}
