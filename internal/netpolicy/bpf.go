package netpolicy

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// The enforcement: five programs written with cilium/ebpf's asm package (no
// C compiler) attached to the sandbox's cgroup v2 directory. Every socket a
// process of the sandbox opens carries that cgroup, whatever its network
// namespace, and no process inside can detach them (bpf(2) is refused by
// seccomp, and attachment without BPF_F_ALLOW_OVERRIDE cannot be replaced
// from a child cgroup) or leave the cgroup (its cgroup namespace is rooted
// there, /sys is read-only and mount(2) is refused).
//
//	connect4/6   connect() on TCP, UDP and ping sockets: EPERM for a
//	             destination the policy does not allow.
//	sendmsg4/6   sendto()/sendmsg() with an explicit destination on
//	             unconnected UDP sockets (they never call connect): EPERM.
//	egress       cgroup_skb egress, the catch-all: every IPv4/IPv6 packet
//	             a socket of the sandbox sends (ICMP, other protocols,
//	             anything that slipped past a socket hook) is dropped unless
//	             allowed or part of a flow a hook allowed.
//
// All of them look the destination up in one LPM trie per sandbox (allow),
// keyed by 128-bit address (IPv4 as ::ffff:a.b.c.d, so that IPv4-mapped
// destinations of IPv6 sockets meet the same rules), whose value lists up to
// maxPortRanges (first port, last port, protocol bits) entries.

// lpmKey is the key of the allow map.
type lpmKey struct {
	Prefixlen uint32
	Addr      [16]byte
}

// entry is one (port range, protocols) of an allow-map value.
type entry struct {
	First, Last uint16
	Protos      uint32
}

// lpmValue is the allow map's value; unused entries have no protocols and
// never match.
type lpmValue [maxPortRanges]entry

// flowKey identifies a destination: the key of the flows and refused maps.
// Hook is zero in flows, the refusing hook in refused.
type flowKey struct {
	Addr  [16]byte
	Port  uint16
	Proto uint8
	Hook  uint8
}

// Hooks, as counted in flowKey.Hook.
const (
	hookConnect = 1
	hookSendmsg = 2
	hookEgress  = 3
	hookTap     = 4 // tc on a microVM's veth (tap.go)
	hookSpoof   = 5 // a microVM frame with a forged MAC or source
)

const (
	allowMapEntries   = 16384
	flowMapEntries    = 8192
	refusedMapEntries = 4096
)

// Stack layout shared by the programs (offsets from R10).
const (
	stKey     = -24  // lpmKey: prefixlen at -24, address at -20..-5
	stFlow    = -48  // flowKey: address at -48..-33, port/proto/hook at -32..-29
	stFlowPP  = -32  // port (u16) | proto << 16 in one word
	stHook    = -29  // hook byte of the flow key
	stOne     = -56  // u64 1, a counter's first value
	stZero    = -60  // u32 0, key of the total counter
	stHdr     = -104 // packet header copy (egress), 40 bytes
	stPortBuf = -112 // destination port bytes (egress)
)

// maps are one sandbox's maps.
type maps struct {
	allow   *ebpf.Map // lpmKey -> lpmValue
	flows   *ebpf.Map // flowKey -> u8: destinations a hook allowed
	refused *ebpf.Map // flowKey -> u64: refused attempts
	total   *ebpf.Map // [0] -> u64: every refused attempt (LRU-proof)
}

func newMaps() (*maps, error) {
	var m maps
	var err error
	mk := func(spec *ebpf.MapSpec) *ebpf.Map {
		if err != nil {
			return nil
		}
		var mp *ebpf.Map
		mp, err = ebpf.NewMap(spec)
		if err != nil {
			err = fmt.Errorf("create map %s: %w", spec.Name, err)
		}
		return mp
	}
	m.allow = mk(&ebpf.MapSpec{Name: "corral_allow", Type: ebpf.LPMTrie, KeySize: 20, ValueSize: 8 * maxPortRanges,
		MaxEntries: allowMapEntries, Flags: unix.BPF_F_NO_PREALLOC})
	m.flows = mk(&ebpf.MapSpec{Name: "corral_flows", Type: ebpf.LRUHash, KeySize: 20, ValueSize: 1, MaxEntries: flowMapEntries})
	m.refused = mk(&ebpf.MapSpec{Name: "corral_refused", Type: ebpf.LRUHash, KeySize: 20, ValueSize: 8, MaxEntries: refusedMapEntries})
	m.total = mk(&ebpf.MapSpec{Name: "corral_total", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		m.close()
		return nil, err
	}
	return &m, nil
}

func (m *maps) close() {
	for _, mp := range []*ebpf.Map{m.allow, m.flows, m.refused, m.total} {
		if mp != nil {
			mp.Close()
		}
	}
}

// progKind is one of the five programs.
type progKind struct {
	name   string
	typ    ebpf.ProgramType
	attach ebpf.AttachType
	v6     bool
	hook   int
}

var progKinds = []progKind{
	{"corral_connect4", ebpf.CGroupSockAddr, ebpf.AttachCGroupInet4Connect, false, hookConnect},
	{"corral_connect6", ebpf.CGroupSockAddr, ebpf.AttachCGroupInet6Connect, true, hookConnect},
	{"corral_sendmsg4", ebpf.CGroupSockAddr, ebpf.AttachCGroupUDP4Sendmsg, false, hookSendmsg},
	{"corral_sendmsg6", ebpf.CGroupSockAddr, ebpf.AttachCGroupUDP6Sendmsg, true, hookSendmsg},
	{"corral_egress", ebpf.CGroupSKB, ebpf.AttachCGroupInetEgress, false, hookEgress},
}

// filter is one sandbox's loaded programs and their maps.
type filter struct {
	maps  *maps
	progs []*ebpf.Program // in progKinds order
}

// loadFilter creates the maps and loads the programs (not attached).
func loadFilter() (*filter, error) {
	m, err := newMaps()
	if err != nil {
		return nil, err
	}
	f := &filter{maps: m}
	for _, k := range progKinds {
		var insns asm.Instructions
		if k.typ == ebpf.CGroupSKB {
			insns = egressProgram(m)
		} else {
			insns = sockAddrProgram(m, k.v6, k.hook)
		}
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name: k.name, Type: k.typ, AttachType: k.attach, Instructions: insns, License: "Apache-2.0",
		})
		if err != nil {
			f.close()
			var ve *ebpf.VerifierError
			if errors.As(err, &ve) {
				return nil, fmt.Errorf("load %s: %+v", k.name, ve)
			}
			return nil, fmt.Errorf("load %s: %w", k.name, err)
		}
		f.progs = append(f.progs, p)
	}
	return f, nil
}

func (f *filter) close() {
	for _, p := range f.progs {
		p.Close()
	}
	f.maps.close()
}

// attach attaches every program to the cgroup v2 directory. The attachment
// is not a bpf_link: it stays while the cgroup exists, through a daemon
// restart, and goes with the cgroup's removal.
func (f *filter) attach(cgroupDir string) error {
	dir, err := os.Open(cgroupDir)
	if err != nil {
		return fmt.Errorf("open cgroup %s: %w", cgroupDir, err)
	}
	defer dir.Close()
	for i, k := range progKinds {
		// ALLOW_MULTI: a host whose parent cgroups carry programs with
		// ALLOW_MULTI (systemd's IP accounting) refuses exclusive ones
		// below; the parents' programs run too, which only denies more.
		err := link.RawAttachProgram(link.RawAttachProgramOptions{
			Target: int(dir.Fd()), Program: f.progs[i], Attach: k.attach, Flags: unix.BPF_F_ALLOW_MULTI,
		})
		if err != nil {
			return fmt.Errorf("attach %s to %s: %w", k.name, cgroupDir, err)
		}
	}
	return nil
}

// recoverFilter finds the maps of the programs attached to cgroupDir (after
// a daemon restart, when only the kernel still holds them).
func recoverFilter(cgroupDir string) (*filter, error) {
	dir, err := os.Open(cgroupDir)
	if err != nil {
		return nil, fmt.Errorf("open cgroup %s: %w", cgroupDir, err)
	}
	defer dir.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(dir.Fd()), Attach: ebpf.AttachCGroupInet4Connect})
	if err != nil {
		return nil, fmt.Errorf("query programs of %s: %w", cgroupDir, err)
	}
	return mapsOfProgram(res, "corral_connect4", cgroupDir)
}

// mapsOfProgram finds the maps of the attached program called name.
func mapsOfProgram(res *link.QueryResult, name, where string) (*filter, error) {
	for _, ap := range res.Programs {
		p, err := ebpf.NewProgramFromID(ap.ID)
		if err != nil {
			continue
		}
		info, err := p.Info()
		p.Close()
		if err != nil || info.Name != name {
			continue
		}
		ids, _ := info.MapIDs()
		m := &maps{}
		for _, id := range ids {
			mp, err := ebpf.NewMapFromID(id)
			if err != nil {
				continue
			}
			mi, err := mp.Info()
			if err != nil {
				mp.Close()
				continue
			}
			switch mi.Name {
			case "corral_allow":
				m.allow = mp
			case "corral_flows":
				m.flows = mp
			case "corral_refused":
				m.refused = mp
			case "corral_total":
				m.total = mp
			default:
				mp.Close()
			}
		}
		if m.allow == nil || m.flows == nil || m.refused == nil || m.total == nil {
			m.close()
			return nil, fmt.Errorf("programs of %s lack their maps", where)
		}
		return &filter{maps: m}, nil
	}
	return nil, fmt.Errorf("no %s program attached to %s", name, where)
}

// storeAddr4 writes an IPv4 address (in R2, network byte order as loaded)
// as ::ffff:a.b.c.d into the lpm key and the flow key.
func storeAddr4() asm.Instructions {
	return asm.Instructions{
		asm.StoreImm(asm.RFP, stKey, 128, asm.Word),
		asm.StoreImm(asm.RFP, stKey+4, 0, asm.Word),
		asm.StoreImm(asm.RFP, stKey+8, 0, asm.Word),
		asm.StoreImm(asm.RFP, stKey+12, int64(int32(-65536)), asm.Word), // bytes 00 00 ff ff
		asm.StoreMem(asm.RFP, stKey+16, asm.R2, asm.Word),
		asm.StoreImm(asm.RFP, stFlow, 0, asm.Word),
		asm.StoreImm(asm.RFP, stFlow+4, 0, asm.Word),
		asm.StoreImm(asm.RFP, stFlow+8, int64(int32(-65536)), asm.Word),
		asm.StoreMem(asm.RFP, stFlow+12, asm.R2, asm.Word),
	}
}

// storeAddr6 copies four address words from src+off into both keys.
func storeAddr6(src asm.Register, off int16) asm.Instructions {
	insns := asm.Instructions{asm.StoreImm(asm.RFP, stKey, 128, asm.Word)}
	for i := int16(0); i < 4; i++ {
		insns = append(insns,
			asm.LoadMem(asm.R2, src, off+4*i, asm.Word),
			asm.StoreMem(asm.RFP, stKey+4+4*i, asm.R2, asm.Word),
			asm.StoreMem(asm.RFP, stFlow+4*i, asm.R2, asm.Word),
		)
	}
	return insns
}

// protoBits turns the IP protocol number in R2 into the rule bit in R7 and
// stores port (R8) | proto << 16 into the flow key.
func protoBits() asm.Instructions {
	return asm.Instructions{
		asm.Mov.Imm(asm.R7, int32(ProtoOther)),
		asm.JNE.Imm(asm.R2, unix.IPPROTO_TCP, "not_tcp"),
		asm.Mov.Imm(asm.R7, int32(ProtoTCP)),
		asm.Ja.Label("proto_done"),
		asm.JNE.Imm(asm.R2, unix.IPPROTO_UDP, "not_udp").WithSymbol("not_tcp"),
		asm.Mov.Imm(asm.R7, int32(ProtoUDP)),
		asm.Ja.Label("proto_done"),
		asm.JEq.Imm(asm.R2, unix.IPPROTO_ICMP, "is_icmp").WithSymbol("not_udp"),
		asm.JNE.Imm(asm.R2, unix.IPPROTO_ICMPV6, "proto_done"),
		// Ping sockets have no port; the rule's ICMP entry covers 0-65535.
		asm.Mov.Imm(asm.R7, int32(ProtoICMP)).WithSymbol("is_icmp"),
		asm.Mov.Imm(asm.R8, 0),
		asm.Mov.Reg(asm.R3, asm.R2).WithSymbol("proto_done"),
		asm.LSh.Imm(asm.R3, 16),
		asm.Or.Reg(asm.R3, asm.R8),
		asm.StoreMem(asm.RFP, stFlowPP, asm.R3, asm.Word),
	}
}

// decide looks the key up in the allow map and checks protocol (R7) and
// port (R8) against the entries; it jumps to "allow" or falls through to
// the flows check (egress) or "deny".
func decide(m *maps, egress bool) asm.Instructions {
	insns := append(lookup(m.allow, stKey),
		// No prefix covers the destination: not allowed (default deny).
		asm.JEq.Imm(asm.R0, 0, "not_allowed"),
		asm.Mov.Reg(asm.R9, asm.R0),
	)
	for i := int16(0); i < maxPortRanges; i++ {
		next := fmt.Sprintf("entry_%d", i+1)
		first := asm.LoadMem(asm.R1, asm.R9, 8*i+4, asm.Word)
		if i > 0 {
			first = first.WithSymbol(fmt.Sprintf("entry_%d", i))
		}
		insns = append(insns,
			// An allowed address on another protocol (UDP to an HTTPS
			// host, ICMP sweeps) stays refused.
			first,
			asm.And.Reg(asm.R1, asm.R7),
			asm.JEq.Imm(asm.R1, 0, next),
			// An allowed host on a port the rule does not list (SSH,
			// database and admin ports of a package mirror) stays refused.
			asm.LoadMem(asm.R1, asm.R9, 8*i, asm.Half),
			asm.JLT.Reg(asm.R8, asm.R1, next),
			asm.LoadMem(asm.R1, asm.R9, 8*i+2, asm.Half),
			asm.JGT.Reg(asm.R8, asm.R1, next),
			asm.Ja.Label("allow"),
		)
	}
	insns = append(insns, asm.Mov.Imm(asm.R0, 0).WithSymbol(fmt.Sprintf("entry_%d", maxPortRanges)))
	if egress {
		// A flow a socket hook allowed goes on while its DNS answer ages
		// out; UpdateNetwork clears the flows, so revoked rules also cut
		// established connections.
		insns = slices.Concat(insns,
			asm.Instructions{asm.StoreImm(asm.RFP, stHook, 0, asm.Byte).WithSymbol("not_allowed")},
			lookup(m.flows, stFlow),
			asm.Instructions{asm.JNE.Imm(asm.R0, 0, "allow"), asm.Ja.Label("deny")},
		)
	} else {
		insns = append(insns, asm.Ja.Label("deny").WithSymbol("not_allowed"))
	}
	return insns
}

// verdicts are the allow and deny tails: allow records the flow (socket
// hooks), deny counts the attempt per destination and in total.
func verdicts(m *maps, hook int) asm.Instructions {
	return verdictsReturning(m, hook, 1, 0)
}

// verdictsReturning is verdicts with the program type's pass and drop
// return values (cgroup programs: 1 and 0; tc: TC_ACT_OK and TC_ACT_SHOT).
func verdictsReturning(m *maps, hook int, pass, drop int32) asm.Instructions {
	var insns asm.Instructions
	if hook == hookEgress {
		insns = append(insns, asm.Mov.Imm(asm.R0, pass).WithSymbol("allow"), asm.Return())
	} else {
		insns = slices.Concat(insns,
			storeOne("allow", 0),
			putOne(m.flows, stFlow),
			asm.Instructions{asm.Mov.Imm(asm.R0, pass), asm.Return()},
		)
	}
	firstRefusal := putOne(m.refused, stFlow)
	firstRefusal[0] = firstRefusal[0].WithSymbol("first_refusal")
	return slices.Concat(insns,
		storeOne("deny", hook),
		lookup(m.refused, stFlow),
		asm.Instructions{
			asm.JEq.Imm(asm.R0, 0, "first_refusal"),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
			asm.Ja.Label("count_total"),
		},
		firstRefusal,
		asm.Instructions{asm.StoreImm(asm.RFP, stZero, 0, asm.Word).WithSymbol("count_total")},
		lookup(m.total, stZero),
		asm.Instructions{
			asm.JEq.Imm(asm.R0, 0, "refuse"),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
			// connect/sendmsg: 0 makes the call fail with EPERM; egress: 0
			// drops the packet (tc: TC_ACT_SHOT).
			asm.Mov.Imm(asm.R0, drop).WithSymbol("refuse"),
			asm.Return(),
		},
	)
}

// storeOne, at symbol, sets the flow key's hook byte and the u64 1 a new
// counter starts at.
func storeOne(symbol string, hook int) asm.Instructions {
	return asm.Instructions{
		asm.StoreImm(asm.RFP, stHook, int64(hook), asm.Byte).WithSymbol(symbol),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreMem(asm.RFP, stOne, asm.R1, asm.DWord),
	}
}

// lookup looks the stack key at off up in mp (R0: the value or 0).
func lookup(mp *ebpf.Map, off int32) asm.Instructions {
	return asm.Instructions{
		asm.LoadMapPtr(asm.R1, mp.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, off),
		asm.FnMapLookupElem.Call(),
	}
}

// putOne sets the stack key at off in mp to the u64 1 at stOne.
func putOne(mp *ebpf.Map, off int32) asm.Instructions {
	return asm.Instructions{
		asm.LoadMapPtr(asm.R1, mp.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, off),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stOne),
		asm.Mov.Imm(asm.R4, 0), // BPF_ANY
		asm.FnMapUpdateElem.Call(),
	}
}

// Offsets in struct bpf_sock_addr.
const (
	saUserIP4  = 4
	saUserIP6  = 8
	saUserPort = 24
	saProtocol = 36
)

// sockAddrProgram is connect4/6 or sendmsg4/6.
func sockAddrProgram(m *maps, v6 bool, hook int) asm.Instructions {
	insns := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}
	if v6 {
		insns = append(insns, storeAddr6(asm.R6, saUserIP6)...)
	} else {
		insns = append(insns, asm.LoadMem(asm.R2, asm.R6, saUserIP4, asm.Word))
		insns = append(insns, storeAddr4()...)
	}
	insns = append(insns,
		asm.LoadMem(asm.R8, asm.R6, saUserPort, asm.Word),
		asm.HostTo(asm.BE, asm.R8, asm.Half),
		asm.LoadMem(asm.R2, asm.R6, saProtocol, asm.Word),
	)
	insns = append(insns, protoBits()...)
	insns = append(insns, decide(m, false)...)
	return append(insns, verdicts(m, hook)...)
}

// Offsets in struct __sk_buff and the IP headers.
const (
	skbProtocol   = 16
	ethPIPv4LE    = 0x0008 // htons(ETH_P_IP) as loaded on little-endian
	ethPIPv6LE    = 0xdd86 // htons(ETH_P_IPV6)
	ip4HeaderLen  = 20
	ip6HeaderLen  = 40
	ip4FragMaskLE = 0xff1f // fragment offset bits of frag_off, loaded LE
)

// loadBytes copies n packet bytes from offset off (or from R2 when offReg
// is R2) to the stack at dst with bpf_skb_load_bytes; the skb is in R6.
func loadBytes(off int32, offReg asm.Register, dst int16, n int32) asm.Instructions {
	insns := asm.Instructions{asm.Mov.Reg(asm.R1, asm.R6)}
	if offReg != asm.R2 {
		insns = append(insns, asm.Mov.Imm(asm.R2, off))
	}
	return append(insns,
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, int32(dst)),
		asm.Mov.Imm(asm.R4, n),
		asm.FnSkbLoadBytes.Call(),
	)
}

// ip4L4 follows storeAddr4 in a program that read the IPv4 header, found l2
// bytes into the packet, to stHdr: R9 = protocol, R2 = offset of the L4
// header, then on to "l4"; a non-first fragment goes to "have_port".
func ip4L4(l2 int32) asm.Instructions {
	insns := asm.Instructions{
		asm.LoadMem(asm.R9, asm.RFP, stHdr+9, asm.Byte),
		// A non-first fragment carries no port: checked as port 0.
		asm.LoadMem(asm.R1, asm.RFP, stHdr+6, asm.Half),
		asm.And.Imm(asm.R1, ip4FragMaskLE),
		asm.JNE.Imm(asm.R1, 0, "have_port"),
		asm.LoadMem(asm.R2, asm.RFP, stHdr, asm.Byte),
		asm.And.Imm(asm.R2, 0x0f),
		asm.LSh.Imm(asm.R2, 2),
	}
	if l2 > 0 {
		insns = append(insns, asm.Add.Imm(asm.R2, l2))
	}
	return append(insns, asm.Ja.Label("l4"))
}

// l4Decide follows storeAddr6 for the IPv6 header (l2 bytes into the
// packet) at stHdr, and is the "l4" target of ip4L4: it reads a TCP or UDP
// destination port into R8 and decides with the sandbox's maps.
func l4Decide(m *maps, l2 int32) asm.Instructions {
	insns := asm.Instructions{
		asm.LoadMem(asm.R9, asm.RFP, stHdr+6, asm.Byte),
		asm.Mov.Imm(asm.R2, l2+ip6HeaderLen),
		// TCP and UDP: the destination port is 2 bytes into the L4 header.
		asm.JEq.Imm(asm.R9, unix.IPPROTO_TCP, "read_port").WithSymbol("l4"),
		asm.JNE.Imm(asm.R9, unix.IPPROTO_UDP, "have_port"),
		asm.Add.Imm(asm.R2, 2).WithSymbol("read_port"),
	}
	insns = append(insns, loadBytes(0, asm.R2, stPortBuf, 2)...)
	insns = append(insns,
		asm.JNE.Imm(asm.R0, 0, "have_port"),
		asm.LoadMem(asm.R8, asm.RFP, stPortBuf, asm.Half),
		asm.HostTo(asm.BE, asm.R8, asm.Half),
		asm.Mov.Reg(asm.R2, asm.R9).WithSymbol("have_port"),
	)
	insns = append(insns, protoBits()...)
	return append(insns, decide(m, true)...)
}

// egressProgram is the cgroup_skb egress catch-all.
func egressProgram(m *maps) asm.Instructions {
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.Mov.Imm(asm.R8, 0),
		asm.LoadMem(asm.R2, asm.R6, skbProtocol, asm.Word),
		asm.JEq.Imm(asm.R2, ethPIPv4LE, "ipv4"),
		asm.JEq.Imm(asm.R2, ethPIPv6LE, "ipv6"),
		// Neither IPv4 nor IPv6 from an IP socket: nothing to allow.
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	}
	// IPv4: destination at 16, protocol at 9, header length from byte 0.
	v4 := loadBytes(0, asm.R0, stHdr, ip4HeaderLen)
	v4[0] = v4[0].WithSymbol("ipv4")
	insns = append(insns, v4...)
	insns = append(insns,
		// A header that cannot be read is not sent.
		asm.JNE.Imm(asm.R0, 0, "drop"),
		asm.LoadMem(asm.R2, asm.RFP, stHdr+16, asm.Word),
	)
	insns = append(insns, storeAddr4()...)
	insns = append(insns, ip4L4(0)...)
	// IPv6: destination at 24, next header at 6; extension headers are
	// not walked, so such packets are checked as "other" protocol.
	v6 := loadBytes(0, asm.R0, stHdr, ip6HeaderLen)
	v6[0] = v6[0].WithSymbol("ipv6")
	insns = append(insns, v6...)
	insns = append(insns, asm.JNE.Imm(asm.R0, 0, "drop"))
	insns = append(insns, storeAddr6(asm.RFP, stHdr+24)...)
	insns = append(insns, l4Decide(m, 0)...)
	insns = append(insns, verdicts(m, hookEgress)...)
	return append(insns, asm.Mov.Imm(asm.R0, 0).WithSymbol("drop"), asm.Return())
}
