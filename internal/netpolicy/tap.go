package netpolicy

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// A microVM's packets come from its guest kernel, not from sockets of the
// sandbox's cgroup, so the cgroup programs never see them. Its slot bridges
// the VM's tap with eth0 inside the namespace, and one tc program on the
// node-side veth's ingress (everything the guest sends, before the node
// routes it) enforces the same allow map and counts in the same refused and
// total maps (hook "tap"). The guest kernel is the attacker here (a command
// with CAP_NET_RAW, or a guest-kernel exploit): it can write any frame, so
// the program also checks who the frame claims to be from.

// guestIdentity is what a microVM's frames must carry: the MAC QEMU gives
// its NIC and the slot's addresses.
type guestIdentity struct {
	MAC   net.HardwareAddr
	Addr4 netip.Addr
	Addr6 netip.Addr
	// NetnsMAC is the namespace's own end of the veth, whose MAC its
	// bridge also takes: their frames (MLD reports pending from before
	// the rewiring, the bridge's IPv4 chatter) are dropped uncounted, as
	// they are no guest's doing.
	NetnsMAC net.HardwareAddr
}

// linkLocal is the guest kernel's EUI-64 link-local address for mac.
func linkLocal(mac net.HardwareAddr) netip.Addr {
	var a [16]byte
	a[0], a[1] = 0xfe, 0x80
	a[8], a[9], a[10], a[11], a[12] = mac[0]^0x02, mac[1], mac[2], 0xff, 0xfe
	a[13], a[14], a[15] = mac[3], mac[4], mac[5]
	return netip.AddrFrom16(a)
}

// guestMAC is the locally administered MAC of the VM in slot index.
func guestMAC(index uint32) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0x76, byte(index >> 24), byte(index >> 16), byte(index >> 8), byte(index)}
}

// Stack slots of the tap program beyond the shared layout.
const (
	// Ethernet header copy, 14 bytes (-130..-117): the source MAC's
	// first word is then 4-byte aligned, as the verifier requires.
	stEth = -130
	// ARP packet copy (28 bytes, -106..-79): the sender address aligned.
	stARP          = -106
	skbVLANPresent = 20 // offset in struct __sk_buff
	ethHLen        = 14
	tcActOK        = 0      // TC_ACT_OK / TCX_PASS
	tcActShot      = 2      // TC_ACT_SHOT / TCX_DROP
	ethPARPLE      = 0x0608 // htons(ETH_P_ARP) as loaded on little-endian
)

// le32 is the word b[0:4] as a little-endian load sees it.
func le32(b []byte) int32 { return int32(binary.LittleEndian.Uint32(b)) }

// tapProgram is the tc program of a microVM's veth.
func tapProgram(m *maps, g guestIdentity) asm.Instructions {
	mac, a4, a6, ll := []byte(g.MAC), g.Addr4.As4(), g.Addr6.As16(), linkLocal(g.MAC).As16()
	nsMAC := []byte(g.NetnsMAC)
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.Mov.Imm(asm.R8, 0),
		// A VLAN tag the veth carries outside the frame would put the
		// frame on another segment of the bridge: dropped.
		asm.LoadMem(asm.R1, asm.R6, skbVLANPresent, asm.Word),
		asm.JNE.Imm(asm.R1, 0, "drop"),
	}
	insns = append(insns, loadBytes(0, asm.R0, stEth, ethHLen)...)
	insns = append(insns,
		asm.JNE.Imm(asm.R0, 0, "drop"),
		// MAC spoofing: a frame claiming the gateway's or another
		// sandbox's MAC would teach the bridge to send their traffic here.
		asm.LoadMem(asm.R1, asm.RFP, stEth+6, asm.Word),
		asm.JNE.Imm32(asm.R1, le32(mac[0:4]), "other_mac"),
		asm.LoadMem(asm.R1, asm.RFP, stEth+10, asm.Half),
		asm.JNE.Imm32(asm.R1, int32(binary.LittleEndian.Uint16(mac[4:6])), "other_mac"),
		asm.LoadMem(asm.R2, asm.RFP, stEth+12, asm.Half),
		asm.JEq.Imm(asm.R2, ethPIPv4LE, "ipv4"),
		asm.JEq.Imm(asm.R2, ethPIPv6LE, "ipv6"),
		// Other ethertypes (VLAN tags that would hide an IP packet from
		// these checks, raw L2 protocols): dropped.
		asm.JNE.Imm(asm.R2, ethPARPLE, "drop"),
	)
	// ARP: only about the guest's own IPv4 address (sender protocol
	// address at 14); ARP spoofing another sandbox's or the gateway's
	// address would redirect their traffic to this VM.
	insns = append(insns, loadBytes(ethHLen, asm.R0, stARP, 28)...)
	insns = append(insns,
		asm.JNE.Imm(asm.R0, 0, "drop"),
		asm.LoadMem(asm.R1, asm.RFP, stARP+14, asm.Word),
		asm.JNE.Imm32(asm.R1, le32(a4[:]), "spoofed"),
		asm.Ja.Label("allow_l2"),
	)
	// IPv4.
	v4 := loadBytes(ethHLen, asm.R0, stHdr, ip4HeaderLen)
	v4[0] = v4[0].WithSymbol("ipv4")
	insns = append(insns, v4...)
	insns = append(insns,
		asm.JNE.Imm(asm.R0, 0, "drop"),
		// Source spoofing: the DNS proxy knows a sandbox by its source
		// address, and the NAT would carry a forged one out.
		asm.LoadMem(asm.R1, asm.RFP, stHdr+12, asm.Word),
		asm.JNE.Imm32(asm.R1, le32(a4[:]), "spoofed"),
		asm.LoadMem(asm.R2, asm.RFP, stHdr+16, asm.Word),
	)
	insns = append(insns, storeAddr4()...)
	insns = append(insns, ip4L4(ethHLen)...)
	// IPv6.
	v6 := loadBytes(ethHLen, asm.R0, stHdr, ip6HeaderLen)
	v6[0] = v6[0].WithSymbol("ipv6")
	insns = append(insns, v6...)
	insns = append(insns, asm.JNE.Imm(asm.R0, 0, "drop"))
	// Source: the slot's address, or (for neighbour discovery only) a
	// link-local or the unspecified address.
	for i := 0; i < 4; i++ {
		insns = append(insns,
			asm.LoadMem(asm.R1, asm.RFP, stHdr+8+int16(4*i), asm.Word),
			asm.JNE.Imm32(asm.R1, le32(a6[4*i:]), "src6_other"))
	}
	insns = append(insns, asm.Ja.Label("src6_own"))
	insns = append(insns,
		asm.LoadMem(asm.R1, asm.RFP, stHdr+8, asm.Half).WithSymbol("src6_other"),
		asm.And.Imm(asm.R1, 0xc0ff), // fe80::/10 as loaded LE
		asm.JEq.Imm(asm.R1, 0x80fe, "nd_only"),
		asm.LoadMem(asm.R1, asm.RFP, stHdr+8, asm.DWord),
		asm.LoadMem(asm.R2, asm.RFP, stHdr+16, asm.DWord),
		asm.Or.Reg(asm.R1, asm.R2),
		asm.JEq.Imm(asm.R1, 0, "nd_only"),
		asm.Ja.Label("spoofed"),
	)
	// Link-local and unspecified sources reach nothing beyond the link
	// (the allow map denies fe80::/10 and multicast): anything but
	// neighbour discovery (the guest's MLD reports) is dropped uncounted.
	insns = append(insns, neighbourDiscovery(a6, ll, "nd_only", "drop", "spoofed")...)
	insns = append(insns, neighbourDiscovery(a6, ll, "src6_own", "policy6", "spoofed")...)
	s6 := storeAddr6(asm.RFP, stHdr+24)
	s6[0] = s6[0].WithSymbol("policy6")
	insns = append(insns, s6...)
	insns = append(insns, l4Decide(m, ethHLen)...)
	// Allowed destinations are remembered in flows as the connect hook
	// does for containers: a download outlives its DNS answer's TTL.
	insns = append(insns, verdictsReturning(m, hookConnect, tcActOK, tcActShot)...)
	// The namespace's own veth end: dropped, not counted.
	insns = append(insns,
		asm.LoadMem(asm.R1, asm.RFP, stEth+6, asm.Word).WithSymbol("other_mac"),
		asm.JNE.Imm32(asm.R1, le32(nsMAC[0:4]), "spoofed"),
		asm.LoadMem(asm.R1, asm.RFP, stEth+10, asm.Half),
		asm.JNE.Imm32(asm.R1, int32(binary.LittleEndian.Uint16(nsMAC[4:6])), "spoofed"),
		asm.Ja.Label("drop"),
	)
	// A forged frame counts as a refusal under hook "spoof" with no
	// destination (what it claims is not to be trusted).
	insns = append(insns,
		asm.StoreImm(asm.RFP, stFlow, 0, asm.Word).WithSymbol("spoofed"),
		asm.StoreImm(asm.RFP, stFlow+4, 0, asm.Word),
		asm.StoreImm(asm.RFP, stFlow+8, 0, asm.Word),
		asm.StoreImm(asm.RFP, stFlow+12, 0, asm.Word),
		asm.StoreImm(asm.RFP, stFlowPP, 0, asm.Word),
		asm.StoreImm(asm.RFP, stHook, hookSpoof, asm.Byte),
		asm.Ja.Label("count_refusal"))
	insns = append(insns,
		asm.Mov.Imm(asm.R0, tcActOK).WithSymbol("allow_l2"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcActShot).WithSymbol("drop"),
		asm.Return())
	return fixHook(insns)
}

// fixHook makes the deny tail count refusals under hookTap (verdicts
// writes the hook it was built for; the tap program reuses the connect
// tail for its flow recording) and labels the counting that follows, where
// forged frames join it.
func fixHook(insns asm.Instructions) asm.Instructions {
	for i, ins := range insns {
		if ins.Symbol() == "deny" {
			insns[i] = asm.StoreImm(asm.RFP, stHook, hookTap, asm.Byte).WithSymbol("deny")
			insns[i+1] = insns[i+1].WithSymbol("count_refusal")
		}
	}
	return insns
}

// neighbourDiscovery passes IPv6 neighbour discovery (ICMPv6 133-136 with
// hop limit 255 to a link-local or multicast destination: never routed)
// and jumps to notND for anything else. A neighbour advertisement must be
// about one of the guest's own addresses (global or link-local): one for
// another sandbox's or the gateway's address would poison the node's
// neighbour cache.
func neighbourDiscovery(a6, ll [16]byte, label, notND, badNA string) asm.Instructions {
	l := func(s string) string { return label + "_" + s }
	insns := asm.Instructions{
		asm.LoadMem(asm.R1, asm.RFP, stHdr+6, asm.Byte).WithSymbol(label),
		asm.JNE.Imm(asm.R1, unix.IPPROTO_ICMPV6, notND),
		asm.LoadMem(asm.R1, asm.RFP, stHdr+7, asm.Byte),
		asm.JNE.Imm(asm.R1, 255, notND),
		asm.LoadMem(asm.R1, asm.RFP, stHdr+24, asm.Byte),
		asm.JEq.Imm(asm.R1, 0xff, l("dst_ok")),
		asm.LoadMem(asm.R1, asm.RFP, stHdr+24, asm.Half),
		asm.And.Imm(asm.R1, 0xc0ff),
		asm.JNE.Imm(asm.R1, 0x80fe, notND),
	}
	// ICMPv6 type and the NA target (8 bytes into the message) into the
	// port buffer and the lpm key's address bytes (rewritten later).
	ld := loadBytes(ethHLen+ip6HeaderLen, asm.R0, stKey, 24)
	ld[0] = ld[0].WithSymbol(l("dst_ok"))
	insns = append(insns, ld...)
	insns = append(insns,
		asm.JNE.Imm(asm.R0, 0, "drop"),
		asm.LoadMem(asm.R1, asm.RFP, stKey, asm.Byte),
		asm.JLT.Imm(asm.R1, 133, notND),
		asm.JGT.Imm(asm.R1, 136, notND),
		asm.JNE.Imm(asm.R1, 136, "allow_l2"),
	)
	for i := 0; i < 4; i++ {
		insns = append(insns,
			asm.LoadMem(asm.R1, asm.RFP, stKey+8+int16(4*i), asm.Word),
			asm.JNE.Imm32(asm.R1, le32(a6[4*i:]), l("na_ll")))
	}
	insns = append(insns, asm.Ja.Label("allow_l2"))
	for i := 0; i < 4; i++ {
		ins := asm.LoadMem(asm.R1, asm.RFP, stKey+8+int16(4*i), asm.Word)
		if i == 0 {
			ins = ins.WithSymbol(l("na_ll"))
		}
		insns = append(insns, ins, asm.JNE.Imm32(asm.R1, le32(ll[4*i:]), badNA))
	}
	return append(insns, asm.Ja.Label("allow_l2"))
}

// tapProgramName names the tc program (recovery finds the maps by it).
const tapProgramName = "corral_tap"
