package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/miekg/dns"
)

// learned is an address a DNS answer allowed.
type learned struct {
	names   []string // the queried names that led to it, at most maxLearnedNames
	entries []entry
	expires time.Time
}

// maxLearnedAddrs bounds the addresses one sandbox's answers keep allowed
// (the allow map holds allowMapEntries, rules included): a flood of
// distinct names fills it, and then answers with new addresses come back
// without them, counted, until old ones expire.
const maxLearnedAddrs = 4096

// maxLearnedNames bounds the names kept per address (a wildcard rule lets
// any number of names point at one CDN address). They serve only to
// recompute the address's ports when the rules change; beyond the bound
// its ports stay what the kept names and the answers so far allowed.
const maxLearnedNames = 8

// Sandbox is one sandbox's network.
type Sandbox struct {
	m        *Manager
	id       string
	index    uint32
	addr4    netip.Addr
	addr6    netip.Addr
	hostVeth string
	ns       *os.File // nil after a restart
	filter   *filter
	vm       bool     // a microVM's: enforced by the tap program
	tap      *os.File // the microVM's tap (nil after a restart)

	mu           sync.Mutex
	mode         Mode
	allow        []string
	rules        []Rule
	learned      map[netip.Addr]learned
	refusedNames map[string]uint64
	closed       bool

	limits sandboxLimits // the DNS proxy's limits and refusal counters
}

// Netns is the namespace the sandbox's init must start in.
func (s *Sandbox) Netns() *os.File { return s.ns }

// Addrs are the sandbox's IPv4 and IPv6 addresses.
func (s *Sandbox) Addrs() (netip.Addr, netip.Addr) { return s.addr4, s.addr6 }

// Resolver is the address a sandbox's resolv.conf names.
func (s *Sandbox) Resolver() netip.Addr {
	gw4, _ := s.m.gateways()
	return gw4.Addr()
}

// Record is what Recover and Remove need later.
func (s *Sandbox) Record() Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Record{Index: s.index, Addr4: s.addr4.String(), Addr6: s.addr6.String(), HostVeth: s.hostVeth,
		Mode: s.mode, Allow: slices.Clone(s.allow), VM: s.vm}
}

// Policy is the sandbox's current policy.
func (s *Sandbox) Policy() Policy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Policy{Mode: s.mode, Allow: slices.Clone(s.allow)}
}

// Update replaces the policy. It is in force when Update returns: the
// allow map is rewritten, and flows the old rules allowed are forgotten
// so that the catch-all cuts connections the new rules refuse.
func (s *Sandbox) Update(ctx context.Context, p Policy) error {
	rules, err := Validate(p, s.m.cfg.Presets)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errdefs.FailedPrecondition("sandbox %s: network is closed", s.id)
	}
	s.mode, s.allow, s.rules = p.Mode, slices.Clone(p.Allow), rules
	// Learned addresses keep what the new rules allow for their names.
	for a, l := range s.learned {
		l.entries = nil
		for _, n := range l.names {
			l.entries = mergeEntries(l.entries, s.nameEntriesLocked(n))
		}
		s.learned[a] = l
	}
	if err := s.syncLocked(); err != nil {
		return err
	}
	return clearMap(s.filter.maps.flows)
}

// nameEntries are the (ports, protocols) the rules allow for name.
func (s *Sandbox) nameEntries(name string) []entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nameEntriesLocked(name)
}

func (s *Sandbox) nameEntriesLocked(name string) []entry {
	if s.mode == ModeOpen {
		return []entry{{First: 0, Last: 65535, Protos: uint32(protoAll)}}
	}
	var out []entry
	for _, r := range s.rules {
		if r.Matches(name) {
			out = mergeEntries(out, r.portEntries())
		}
	}
	return out
}

func (s *Sandbox) countRefusedName(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.refusedNames) < refusedMapEntries || s.refusedNames[name] > 0 {
		s.refusedNames[name]++
	}
}

// learn allows the addresses of an answer (before the proxy replies) and
// returns the records the sandbox may see.
func (s *Sandbox) learn(name string, answer []dns.RR, entries []entry) []dns.RR {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	now := time.Now()
	var out []dns.RR
	var static []item
	for _, rr := range answer {
		a, isAddr := answerAddr(rr)
		if !isAddr {
			out = append(out, rr)
			continue
		}
		// DNS rebinding: an allowed name whose answer points at the
		// node, a private range or metadata gets no entry and the record
		// is dropped, unless a rule lists that range by itself.
		if s.deniedLocked(a) {
			continue
		}
		l, known := s.learned[a]
		if !known && len(s.learned) >= maxLearnedAddrs {
			s.limits.refuse(limitLearned)
			continue
		}
		ttl := min(max(time.Duration(rr.Header().Ttl)*time.Second, minLearnedTTL), maxLearnedTTL)
		var widened bool
		l.entries, widened = mergeEntriesChanged(l.entries, entries)
		if len(l.names) < maxLearnedNames && !slices.Contains(l.names, name) {
			l.names = append(l.names, name)
		}
		if exp := now.Add(ttl); exp.After(l.expires) {
			l.expires = exp
		}
		s.learned[a] = l
		// Only this address's key changes: one map write, not a rebuild
		// of the whole table per answer.
		if !known || widened {
			if static == nil {
				static = s.staticItemsLocked()
			}
			if err := s.putLearnedLocked(a, static); err != nil {
				s.m.log.Warn("network: allow DNS answer", "sandbox", s.id, "err", err)
				continue
			}
		}
		out = append(out, rr)
	}
	return out
}

// putLearnedLocked writes the allow-map key of a learned address.
func (s *Sandbox) putLearnedLocked(a netip.Addr, static []item) error {
	k := to16(netip.PrefixFrom(a, a.BitLen()))
	items := static
	if l, ok := s.learned[a]; ok && len(l.entries) > 0 && s.mode != ModeNone {
		items = append(slices.Clip(static), item{k, l.entries})
	}
	v, _ := keyValue(k, items, s.m.deny)
	if v == (lpmValue{}) && !s.staticKeyLocked(k, static) {
		if err := s.filter.maps.allow.Delete(lpmKeyOf(k)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("update allow map: %w", err)
		}
		return nil
	}
	if err := s.filter.maps.allow.Put(lpmKeyOf(k), v); err != nil {
		return fmt.Errorf("update allow map: %w", err)
	}
	return nil
}

// staticKeyLocked reports whether k is a key of the table without learned
// addresses (an item or deny prefix): it stays when its address expires.
func (s *Sandbox) staticKeyLocked(k netip.Prefix, static []item) bool {
	for _, it := range static {
		if it.prefix == k {
			return true
		}
	}
	return slices.Contains(s.m.deny, k)
}

// deniedLocked reports whether a lies in an always-denied range that no
// rule of the sandbox names.
func (s *Sandbox) deniedLocked(a netip.Addr) bool {
	k := to16(netip.PrefixFrom(a, a.BitLen()))
	for _, d := range s.m.deny {
		if !contains(d, k) {
			continue
		}
		for _, r := range s.rules {
			if r.Prefix.IsValid() && contains(d, to16(r.Prefix)) && contains(to16(r.Prefix), k) {
				return false
			}
		}
		return true
	}
	return false
}

func (s *Sandbox) expire(now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var gone []netip.Addr
	for a, l := range s.learned {
		if now.After(l.expires) {
			delete(s.learned, a)
			gone = append(gone, a)
		}
	}
	if len(gone) == 0 || s.closed {
		return nil
	}
	static := s.staticItemsLocked()
	var errs []error
	for _, a := range gone {
		errs = append(errs, s.putLearnedLocked(a, static))
	}
	return errors.Join(errs...)
}

func (s *Sandbox) sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.syncLocked()
}

// syncLocked writes the allow map from the mode, the rules, the learned
// addresses and the sandbox's fixed needs.
func (s *Sandbox) syncLocked() error {
	items := s.staticItemsLocked()
	for a, l := range s.learned {
		if len(l.entries) > 0 && s.mode != ModeNone {
			items = append(items, item{to16(netip.PrefixFrom(a, a.BitLen())), l.entries})
		}
	}
	table, err := buildTable(items, s.m.deny)
	if err != nil {
		s.m.log.Warn("network: rules", "sandbox", s.id, "err", err)
	}
	return syncMap(s.filter.maps.allow, table)
}

// staticItemsLocked are the allow items of the mode, the rules and the
// sandbox's fixed needs: everything but the learned addresses.
func (s *Sandbox) staticItemsLocked() []item {
	all := []entry{{First: 0, Last: 65535, Protos: uint32(protoAll)}}
	host := func(a netip.Addr) netip.Prefix { return to16(netip.PrefixFrom(a, a.BitLen())) }
	items := []item{
		// The sandbox's own loopback and addresses (its namespace's lo;
		// the host's loopback is not reachable from another namespace).
		{to16(netip.MustParsePrefix("127.0.0.0/8")), all},
		{host(netip.IPv6Loopback()), all},
		{host(s.addr4), all},
		{host(s.addr6), all},
	}
	if s.mode != ModeNone {
		// The DNS proxy: the only port of the node a sandbox reaches.
		gw4, gw6 := s.m.gateways()
		dnsPort := []entry{{First: 53, Last: 53, Protos: uint32(ProtoTCP | ProtoUDP)}}
		items = append(items, item{host(gw4.Addr()), dnsPort}, item{host(gw6.Addr()), dnsPort})
	}
	if s.mode == ModeOpen {
		items = append(items, item{netip.MustParsePrefix("::/0"), all},
			item{to16(netip.MustParsePrefix("0.0.0.0/0")), all})
	}
	for _, r := range s.rules {
		if r.Prefix.IsValid() && s.mode != ModeNone {
			items = append(items, item{to16(r.Prefix), r.portEntries()})
		}
	}
	return items
}

// Refusal is one refused destination and how often.
type Refusal struct {
	Addr  netip.Addr
	Port  uint16
	Proto string // tcp, udp, icmp or the protocol number
	Hook  string // connect, sendmsg, egress, tap or spoof (microVM), or dns (Name set)
	Name  string // the refused name, for DNS refusals
	Count uint64
}

// Stats are the refusals of one sandbox.
type Stats struct {
	Total    uint64 // every refused connect, send and packet
	Refusals []Refusal
}

// NetworkStats is Stats as a backend reports it.
func (s *Sandbox) NetworkStats() (backend.NetworkStats, error) {
	st, err := s.Stats()
	if err != nil {
		return backend.NetworkStats{}, err
	}
	out := backend.NetworkStats{Total: st.Total}
	for _, r := range st.Refusals {
		nr := backend.NetworkRefusal{Port: r.Port, Protocol: r.Proto, Hook: r.Hook, Name: r.Name, Count: r.Count}
		if r.Addr.IsValid() {
			nr.Address = r.Addr.String()
		}
		out.Refusals = append(out.Refusals, nr)
	}
	return out, nil
}

// Stats reads the refusal counters.
func (s *Sandbox) Stats() (Stats, error) {
	var st Stats
	if err := s.filter.maps.total.Lookup(uint32(0), &st.Total); err != nil {
		return st, fmt.Errorf("network: read counters: %w", err)
	}
	var k flowKey
	var n uint64
	it := s.filter.maps.refused.Iterate()
	for it.Next(&k, &n) {
		a := netip.AddrFrom16(k.Addr).Unmap()
		st.Refusals = append(st.Refusals, Refusal{Addr: a, Port: k.Port, Proto: protoName(k.Proto),
			Hook: [...]string{"", "connect", "sendmsg", "egress", "tap", "spoof"}[min(int(k.Hook), 5)], Count: n})
	}
	if err := it.Err(); err != nil {
		return st, fmt.Errorf("network: read counters: %w", err)
	}
	s.mu.Lock()
	for name, n := range s.refusedNames {
		st.Refusals = append(st.Refusals, Refusal{Hook: "dns", Name: name, Count: n})
	}
	s.mu.Unlock()
	for reason, n := range s.limits.counts() {
		st.Refusals = append(st.Refusals, Refusal{Hook: "limit", Name: reason, Count: n})
	}
	for _, c := range []struct{ which, name string }{{capConntrack, "conntrack"}, {capDNSRate, "dns-rate-kernel"}} {
		n, err := s.m.node.capRefused(c.which, s.addr4, s.addr6)
		if err != nil {
			return st, fmt.Errorf("network: read counters: %w", err)
		}
		if n > 0 {
			st.Refusals = append(st.Refusals, Refusal{Hook: "limit", Name: c.name, Count: n})
		}
	}
	slices.SortFunc(st.Refusals, func(a, b Refusal) int {
		if a.Count != b.Count {
			return int(b.Count) - int(a.Count)
		}
		return strings.Compare(a.Addr.String()+a.Name, b.Addr.String()+b.Name)
	})
	return st, nil
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 1, 58:
		return "icmp"
	}
	return fmt.Sprint(p)
}

// Close releases the sandbox's network: its veth pair, address and
// handles. The programs go with the cgroup.
func (s *Sandbox) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	m := s.m
	m.mu.Lock()
	delete(m.bySrc, s.addr4)
	delete(m.bySrc, s.addr6)
	delete(m.sandboxes, s.id)
	m.mu.Unlock()
	err := m.node.deleteLink(s.hostVeth)
	if ferr := m.node.forgetSource(s.addr4, s.addr6); ferr != nil {
		m.log.Warn("network: forget per-source caps", "sandbox", s.id, "err", ferr)
	}
	if s.ns != nil {
		s.ns.Close()
	}
	if s.tap != nil {
		s.tap.Close()
	}
	s.filter.close()
	m.mu.Lock()
	delete(m.used, s.index)
	m.mu.Unlock()
	return err
}
