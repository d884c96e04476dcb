package netpolicy

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// TestTapProgramVerdicts runs the microVM tc program on crafted frames
// (BPF_PROG_TEST_RUN): what a guest kernel could send, forged or not.
func TestTapProgramVerdicts(t *testing.T) {
	m, err := newMaps()
	if err != nil {
		t.Skipf("cannot create maps (needs root): %v", err)
	}
	defer m.close()
	g := guestIdentity{MAC: guestMAC(9), Addr4: netip.MustParseAddr("100.96.0.9"), Addr6: netip.MustParseAddr("fd63::9"),
		NetnsMAC: net.HardwareAddr{0x0a, 0, 0, 0, 0, 1}}
	allowed := netip.MustParseAddr("198.51.100.7")
	var v lpmValue
	v[0] = entry{First: 80, Last: 80, Protos: uint32(ProtoTCP)}
	for _, a := range []netip.Addr{allowed, netip.MustParseAddr("2001:db8::7")} {
		// As16 maps IPv4 to ::ffff:a.b.c.d, the map's key form.
		if err := m.allow.Put(lpmKey{Prefixlen: 128, Addr: a.As16()}, v); err != nil {
			t.Fatal(err)
		}
	}
	byHook := func() map[uint8]uint64 {
		out := map[uint8]uint64{}
		var k flowKey
		var n uint64
		it := m.refused.Iterate()
		for it.Next(&k, &n) {
			out[k.Hook] += n
		}
		return out
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: tapProgramName, Type: ebpf.SchedCLS,
		Instructions: tapProgram(m, g), License: "Apache-2.0"})
	if err != nil {
		t.Fatalf("load: %+v", err)
	}
	defer prog.Close()

	eth := func(src net.HardwareAddr, etype uint16, payload []byte) []byte {
		f := append([]byte{0x02, 0x63, 0, 0, 0, 1}, src...)
		f = binary.BigEndian.AppendUint16(f, etype)
		f = append(f, payload...)
		for len(f) < 64 {
			f = append(f, 0)
		}
		return f
	}
	tcp4 := func(src, dst netip.Addr, port uint16) []byte {
		h := make([]byte, 40)
		h[0], h[8], h[9] = 0x45, 64, 6
		binary.BigEndian.PutUint16(h[2:], 40)
		s4, d4 := src.As4(), dst.As4()
		copy(h[12:], s4[:])
		copy(h[16:], d4[:])
		binary.BigEndian.PutUint16(h[20:], 40000)
		binary.BigEndian.PutUint16(h[22:], port)
		return h
	}
	ip6 := func(src, dst netip.Addr, next, hop byte, l4 []byte) []byte {
		h := make([]byte, 40)
		h[0], h[6], h[7] = 0x60, next, hop
		binary.BigEndian.PutUint16(h[4:], uint16(len(l4)))
		s, d := src.As16(), dst.As16()
		copy(h[8:], s[:])
		copy(h[24:], d[:])
		return append(h, l4...)
	}
	na := func(target netip.Addr) []byte {
		b := make([]byte, 24)
		b[0] = 136
		tg := target.As16()
		copy(b[8:], tg[:])
		return b
	}
	arp := func(sender netip.Addr) []byte {
		b := make([]byte, 28)
		binary.BigEndian.PutUint16(b[0:], 1)
		binary.BigEndian.PutUint16(b[2:], 0x0800)
		b[4], b[5] = 6, 4
		binary.BigEndian.PutUint16(b[6:], 1)
		copy(b[8:], g.MAC)
		s := sender.As4()
		copy(b[14:], s[:])
		return b
	}
	other4, other6 := netip.MustParseAddr("100.96.0.10"), netip.MustParseAddr("fd63::10")
	allLinks := netip.MustParseAddr("ff02::1")
	for _, c := range []struct {
		name  string
		frame []byte
		want  uint32 // 0 pass, 2 drop
		hook  uint8  // refusal counted under this hook (0: none)
	}{
		{"allowed destination and port", eth(g.MAC, 0x0800, tcp4(g.Addr4, allowed, 80)), 0, 0},
		{"allowed host, other port", eth(g.MAC, 0x0800, tcp4(g.Addr4, allowed, 22)), 2, hookTap},
		{"forged source MAC", eth(net.HardwareAddr{2, 0x63, 0, 0, 0, 1}, 0x0800, tcp4(g.Addr4, allowed, 80)), 2, hookSpoof},
		{"forged IPv4 source", eth(g.MAC, 0x0800, tcp4(other4, allowed, 80)), 2, hookSpoof},
		{"ARP about its own address", eth(g.MAC, 0x0806, arp(g.Addr4)), 0, 0},
		{"ARP claiming another sandbox's address", eth(g.MAC, 0x0806, arp(other4)), 2, hookSpoof},
		{"VLAN-tagged frame", eth(g.MAC, 0x8100, tcp4(g.Addr4, allowed, 80)), 2, 0},
		{"neighbour advertisement for its address", eth(g.MAC, 0x86dd, ip6(g.Addr6, allLinks, 58, 255, na(g.Addr6))), 0, 0},
		{"neighbour advertisement for its link-local", eth(g.MAC, 0x86dd, ip6(linkLocal(g.MAC), allLinks, 58, 255, na(linkLocal(g.MAC)))), 0, 0},
		{"neighbour advertisement for another address", eth(g.MAC, 0x86dd, ip6(g.Addr6, allLinks, 58, 255, na(other6))), 2, hookSpoof},
		{"forged IPv6 source", eth(g.MAC, 0x86dd, ip6(other6, netip.MustParseAddr("2001:db8::7"), 6, 64, make([]byte, 20))), 2, hookSpoof},
		{"namespace's own frame", eth(g.NetnsMAC, 0x86dd, ip6(netip.MustParseAddr("fe80::1"), allLinks, 58, 1, make([]byte, 8))), 2, 0},
	} {
		var before uint64
		_ = m.total.Lookup(uint32(0), &before)
		hooksBefore := byHook()
		ret, err := prog.Run(&ebpf.RunOptions{Data: c.frame})
		if err != nil {
			t.Fatalf("%s: run: %v", c.name, err)
		}
		if ret != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, ret, c.want)
		}
		var after uint64
		_ = m.total.Lookup(uint32(0), &after)
		if counted := after > before; counted != (c.hook != 0) {
			t.Errorf("%s: refusal counted = %v, want %v", c.name, counted, c.hook != 0)
		}
		if c.hook != 0 && byHook()[c.hook] != hooksBefore[c.hook]+1 {
			t.Errorf("%s: not counted under hook %d", c.name, c.hook)
		}
	}
}
