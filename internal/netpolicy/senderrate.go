package netpolicy

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// addSenderRate installs, in a sandbox's own network namespace (owned by
// the node's user namespace: the sandbox cannot change it), the same DNS
// rate as the node's input hook (twice the proxy's bucket): UDP datagrams
// and TCP SYNs to port 53 of the gateway beyond it are dropped in the
// output hook, in the sending process's own system call. The node's input
// rule stays the cap; this one only moves a flood's cost: a datagram
// dropped here is never sent over the veth and bridge, in softirq time
// charged to no one, but is paid for on the sender's CPU.
func addSenderRate(ns *os.File, gw4, gw6 netip.Addr, dns DNSLimits) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return fmt.Errorf("sender rate: nftables: %w", err)
	}
	t := c.AddTable(&nftables.Table{Name: "corral_sender", Family: nftables.TableFamilyINet})
	accept := nftables.ChainPolicyAccept
	out := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	// Each rule has a bucket of its own (family and protocol): a sender
	// within the proxy's rate never meets one; what passes them all is
	// still capped by the node's input rule.
	rate := &expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(2 * dns.Rate), Unit: expr.LimitTimeSecond, Burst: uint32(2 * dns.Burst), Over: true}
	for _, gw := range []struct {
		proto  byte
		offset uint32
		addr   netip.Addr
	}{{unix.NFPROTO_IPV4, 16, gw4}, {unix.NFPROTO_IPV6, 24, gw6}} {
		if !gw.addr.IsValid() {
			continue
		}
		for _, l4 := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			exprs := []expr.Any{
				&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{gw.proto}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: gw.offset, Len: uint32(gw.addr.BitLen() / 8)},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: gw.addr.AsSlice()},
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{l4}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 53}},
			}
			if l4 == unix.IPPROTO_TCP {
				// SYN without ACK: a new connection, not its data.
				exprs = append(exprs,
					&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
					&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x12}, Xor: []byte{0}},
					&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x02}})
			}
			exprs = append(exprs, rate, &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop})
			c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: exprs})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sender rate: nftables: %w", err)
	}
	return nil
}
