package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// defaultConntrackPerSandbox is the host conntrack entries one sandbox
// address may hold. UDP entries live 30 s unanswered, so a sandbox
// resolving at the proxy's full rate (100 queries/s) stays well under it;
// a flood from 64k source ports stops here instead of filling the host
// table (nf_conntrack_max, 262,144 by default).
const defaultConntrackPerSandbox = 4096

// ctFamily is one address family's part of the per-sandbox caps: where
// the source address lies in the network header, and the sets' names.
type ctFamily struct {
	proto    byte // NFPROTO_IPV4 / NFPROTO_IPV6
	keyType  nftables.SetDatatype
	offset   uint32 // source address in the network header
	addrSize uint32
	suffix   string // of the set names
}

var ctFamilies = []ctFamily{
	{proto: unix.NFPROTO_IPV4, keyType: nftables.TypeIPAddr, offset: 12, addrSize: 4, suffix: "4"},
	{proto: unix.NFPROTO_IPV6, keyType: nftables.TypeIP6Addr, offset: 8, addrSize: 16, suffix: "6"},
}

// Per-source caps. Each has a dynamic set whose elements (one per sandbox
// address) hold its state, and a set whose elements count the packets it
// dropped for that address, read back as the sandbox's refusals.
const (
	capConntrack = "ct"  // flows tracked
	capDNSRate   = "dns" // packets to the DNS proxy
)

// addSourceCaps adds to table t (in c's batch) the per-sandbox caps:
//   - conntrack: in the input hook (flows to the node: the DNS proxy) and
//     in chain fwd (flows through it), a new flow from the bridge whose
//     source address already holds more than limit tracked flows is
//     counted and dropped; one set serves both hooks, so the cap is per
//     address over both;
//   - DNS rate: UDP datagrams and new TCP connections to port 53 of the
//     node beyond twice the proxy's own bucket (DNSLimits) per address are
//     dropped: a sandbox within its rate never meets it, and a flood
//     beyond it is dropped by the kernel before the daemon reads a byte
//     of it (a container sandbox's excess already in its own system call:
//     addSenderRate).
func addSourceCaps(c *nftables.Conn, t *nftables.Table, fwd *nftables.Chain, bridge []byte, limit int, dns DNSLimits) error {
	accept := nftables.ChainPolicyAccept
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	ctNew := []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: nativeU32(expr.CtStateBitNEW), Xor: nativeU32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: nativeU32(0)},
	}
	dport53 := func(proto byte) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 53}},
		}
	}
	// "over" for both: the inverted connlimit / limit matches only past
	// the cap.
	connlimit := &expr.Connlimit{Count: uint32(limit), Flags: 1 /* NFT_CONNLIMIT_F_INV */}
	rate := &expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(2 * dns.Rate), Unit: expr.LimitTimeSecond, Burst: uint32(2 * dns.Burst), Over: true}
	for _, f := range ctFamilies {
		sets := map[string]*nftables.Set{}
		for _, name := range []string{capConntrack, capDNSRate} {
			for _, s := range []*nftables.Set{
				{Table: t, Name: name + "_state" + f.suffix, KeyType: f.keyType, Dynamic: true, Size: 65535},
				{Table: t, Name: name + "_refused" + f.suffix, KeyType: f.keyType, Dynamic: true, Size: 65535},
			} {
				if err := c.AddSet(s, nil); err != nil {
					return fmt.Errorf("source caps: set %s: %w", s.Name, err)
				}
				sets[s.Name] = s
			}
		}
		rule := func(ch *nftables.Chain, which string, match []expr.Any, state expr.Any) {
			st, ref := sets[which+"_state"+f.suffix], sets[which+"_refused"+f.suffix]
			exprs := []expr.Any{
				&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: bridge},
				&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.proto}},
			}
			exprs = append(exprs, match...)
			exprs = append(exprs,
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.offset, Len: f.addrSize},
				&expr.Dynset{SrcRegKey: 1, SetName: st.Name, SetID: st.ID, Operation: unix.NFT_DYNSET_OP_ADD, Exprs: []expr.Any{state}},
				&expr.Dynset{SrcRegKey: 1, SetName: ref.Name, SetID: ref.ID, Operation: unix.NFT_DYNSET_OP_UPDATE, Exprs: []expr.Any{&expr.Counter{}}},
				&expr.Verdict{Kind: expr.VerdictDrop})
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs})
		}
		// Rate first: a datagram dropped there is never tracked.
		rule(in, capDNSRate, dport53(unix.IPPROTO_UDP), rate)
		rule(in, capDNSRate, append(dport53(unix.IPPROTO_TCP), ctNew...), rate)
		rule(in, capConntrack, ctNew, connlimit)
		rule(fwd, capConntrack, ctNew, connlimit)
	}
	return nil
}

// capRefused reads how many packets of the addresses cap which dropped.
func (n *nodeSide) capRefused(which string, addrs ...netip.Addr) (uint64, error) {
	c, err := n.nft()
	if err != nil {
		return 0, fmt.Errorf("nftables: %w", err)
	}
	want := map[netip.Addr]bool{}
	for _, a := range addrs {
		want[a] = true
	}
	var total uint64
	for _, f := range ctFamilies {
		name := which + "_refused" + f.suffix
		els, err := c.GetSetElements(&nftables.Set{Table: n.table(), Name: name, KeyType: f.keyType})
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return 0, fmt.Errorf("nftables: read %s: %w", name, err)
		}
		for _, e := range els {
			a, ok := netip.AddrFromSlice(e.Key)
			if ok && want[a] && e.Counter != nil {
				total += e.Counter.Packets
			}
		}
	}
	return total, nil
}

// forgetSource removes a sandbox address's elements, so that the next
// sandbox on that address starts with no state of its own and none of the
// old one's refusals.
func (n *nodeSide) forgetSource(addrs ...netip.Addr) error {
	c, err := n.nft()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	var errs []error
	for _, f := range ctFamilies {
		for _, a := range addrs {
			if uint32(len(a.AsSlice())) != f.addrSize {
				continue
			}
			for _, which := range []string{capConntrack, capDNSRate} {
				for _, name := range []string{which + "_state" + f.suffix, which + "_refused" + f.suffix} {
					s := &nftables.Set{Table: n.table(), Name: name, KeyType: f.keyType}
					if err := c.SetDeleteElements(s, []nftables.SetElement{{Key: a.AsSlice()}}); err != nil {
						errs = append(errs, err)
						continue
					}
					// An absent element is the usual case.
					if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
						errs = append(errs, fmt.Errorf("nftables: forget %s in %s: %w", a, name, err))
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}
