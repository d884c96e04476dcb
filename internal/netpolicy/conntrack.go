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

// ctFamily is one address family's half of the conntrack cap: the set
// whose elements (one per sandbox address) count its tracked flows, and
// the set whose elements count the new flows refused beyond the cap.
type ctFamily struct {
	proto    byte // NFPROTO_IPV4 / NFPROTO_IPV6
	keyType  nftables.SetDatatype
	offset   uint32 // source address in the network header
	count    string // set name
	refused  string // set name
	addrSize uint32
}

var ctFamilies = []ctFamily{
	{proto: unix.NFPROTO_IPV4, keyType: nftables.TypeIPAddr, offset: 12, addrSize: 4, count: "ct_count4", refused: "ct_refused4"},
	{proto: unix.NFPROTO_IPV6, keyType: nftables.TypeIP6Addr, offset: 8, addrSize: 16, count: "ct_count6", refused: "ct_refused6"},
}

// addConntrackCap adds to table t (in c's batch) the per-sandbox cap:
// in the input hook (flows to the node: the DNS proxy) and in chain fwd
// (flows through it), a new flow from the bridge whose source address
// already holds more than limit tracked flows is counted and dropped.
// One set serves both hooks, so the cap is per address over both.
func addConntrackCap(c *nftables.Conn, t *nftables.Table, fwd *nftables.Chain, bridge []byte, limit int) error {
	accept := nftables.ChainPolicyAccept
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	for _, f := range ctFamilies {
		count := &nftables.Set{Table: t, Name: f.count, KeyType: f.keyType, Dynamic: true, Size: 65535}
		refused := &nftables.Set{Table: t, Name: f.refused, KeyType: f.keyType, Dynamic: true, Size: 65535}
		for _, s := range []*nftables.Set{count, refused} {
			if err := c.AddSet(s, nil); err != nil {
				return fmt.Errorf("conntrack cap: set %s: %w", s.Name, err)
			}
		}
		for _, ch := range []*nftables.Chain{in, fwd} {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: bridge},
				&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.proto}},
				&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
					Mask: nativeU32(expr.CtStateBitNEW), Xor: nativeU32(0)},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: nativeU32(0)},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.offset, Len: f.addrSize},
				// add @ct_countN { saddr ct count over limit }: matches only
				// past the cap (the inverted connlimit of that address).
				&expr.Dynset{SrcRegKey: 1, SetName: f.count, SetID: count.ID, Operation: unix.NFT_DYNSET_OP_ADD,
					Exprs: []expr.Any{&expr.Connlimit{Count: uint32(limit), Flags: 1 /* NFT_CONNLIMIT_F_INV: "over" */}}},
				&expr.Dynset{SrcRegKey: 1, SetName: f.refused, SetID: refused.ID, Operation: unix.NFT_DYNSET_OP_UPDATE,
					Exprs: []expr.Any{&expr.Counter{}}},
				&expr.Verdict{Kind: expr.VerdictDrop},
			}})
		}
	}
	return nil
}

// conntrackRefused reads how many new flows of the addresses were dropped
// at the cap.
func (n *nodeSide) conntrackRefused(addrs ...netip.Addr) (uint64, error) {
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
		els, err := c.GetSetElements(&nftables.Set{Table: n.table(), Name: f.refused, KeyType: f.keyType})
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return 0, fmt.Errorf("nftables: read %s: %w", f.refused, err)
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

// forgetConntrack removes a sandbox address's elements, so that the next
// sandbox on that address starts with no count of its own and none of the
// old one's refusals.
func (n *nodeSide) forgetConntrack(addrs ...netip.Addr) error {
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
			for _, name := range []string{f.count, f.refused} {
				s := &nftables.Set{Table: n.table(), Name: name, KeyType: f.keyType}
				if err := c.SetDeleteElements(s, []nftables.SetElement{{Key: a.AsSlice()}}); err != nil {
					errs = append(errs, err)
					continue
				}
				// Absent elements are the usual case: ignore ENOENT.
				if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("nftables: forget %s in %s: %w", a, name, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}
