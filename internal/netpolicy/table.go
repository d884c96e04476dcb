package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
)

// alwaysDenied are the ranges no sandbox reaches unless a rule names them
// (or a range inside them) explicitly: a broader rule such as 0.0.0.0/0 or
// open mode does not count.
var alwaysDenied = []netip.Prefix{
	// Cloud metadata services and link-local neighbours (credential theft
	// from 169.254.169.254, fe80:: services on the node's links).
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
	// Private networks: the cluster, the harness, other tenants.
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("fc00::/7"),
	// The node's loopback seen through a mapped or unspecified address,
	// multicast and broadcast (service discovery, amplification).
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("224.0.0.0/3"),
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("ff00::/8"),
}

// item is a prefix with the (ports, protocols) allowed to it.
type item struct {
	prefix  netip.Prefix // 128-bit form (IPv4 mapped)
	entries []entry
}

// to16 maps an IPv4 prefix to ::ffff:0:0/96 space; IPv6 stays.
func to16(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4() {
		return netip.PrefixFrom(netip.AddrFrom16(p.Addr().As16()), p.Bits()+96)
	}
	return p
}

// contains reports whether a covers b (both 128-bit).
func contains(a, b netip.Prefix) bool {
	return a.Bits() <= b.Bits() && a.Contains(b.Addr())
}

// buildTable computes the allow map's contents. For each key K (every
// allow and deny prefix) the value is the union of the allow items that
// cover K and are at least as specific as the most specific deny prefix
// covering K: so 0.0.0.0/0 never opens 10.0.0.0/8, while 10.1.0.0/16
// listed by name does.
func buildTable(allow []item, deny []netip.Prefix) (map[lpmKey]lpmValue, error) {
	keys := map[netip.Prefix]bool{}
	for _, it := range allow {
		keys[it.prefix] = true
	}
	for _, d := range deny {
		keys[d] = true
	}
	out := make(map[lpmKey]lpmValue, len(keys))
	var overflow []string
	for k := range keys {
		v, ok := keyValue(k, allow, deny)
		if !ok {
			overflow = append(overflow, k.String())
		}
		out[lpmKeyOf(k)] = v
	}
	if len(overflow) > 0 {
		slices.Sort(overflow)
		return out, fmt.Errorf("more than %d port ranges for %v: the rest are refused", maxPortRanges, overflow)
	}
	return out, nil
}

// keyValue is buildTable's value for one key; false when ranges beyond
// maxPortRanges were cut (fails closed: they are not allowed).
func keyValue(k netip.Prefix, allow []item, deny []netip.Prefix) (lpmValue, bool) {
	denyBits := -1
	for _, d := range deny {
		if contains(d, k) && d.Bits() > denyBits {
			denyBits = d.Bits()
		}
	}
	var es []entry
	for _, it := range allow {
		if contains(it.prefix, k) && it.prefix.Bits() >= denyBits {
			es = mergeEntries(es, it.entries)
		}
	}
	var v lpmValue
	ok := len(es) <= maxPortRanges
	if !ok {
		es = es[:maxPortRanges]
	}
	copy(v[:], es)
	return v, ok
}

func lpmKeyOf(k netip.Prefix) lpmKey {
	return lpmKey{Prefixlen: uint32(k.Bits()), Addr: k.Addr().As16()}
}

// mergeEntries adds b's entries to a, merging equal port ranges.
func mergeEntries(a, b []entry) []entry {
	for _, e := range b {
		i := slices.IndexFunc(a, func(x entry) bool { return x.First == e.First && x.Last == e.Last })
		if i >= 0 {
			a[i].Protos |= e.Protos
		} else {
			a = append(a, e)
		}
	}
	return a
}

// mergeEntriesChanged is mergeEntries, also reporting whether a's
// protocols grew (a new range shows in its length).
func mergeEntriesChanged(a, b []entry) ([]entry, bool) {
	changed := false
	for _, e := range b {
		i := slices.IndexFunc(a, func(x entry) bool { return x.First == e.First && x.Last == e.Last })
		switch {
		case i < 0:
			a = append(a, e)
			changed = true
		case a[i].Protos|e.Protos != a[i].Protos:
			a[i].Protos |= e.Protos
			changed = true
		}
	}
	return a, changed
}

// syncMap makes the allow map hold exactly want.
func syncMap(m *ebpf.Map, want map[lpmKey]lpmValue) error {
	var stale []lpmKey
	var k lpmKey
	it := m.Iterate()
	var v lpmValue
	for it.Next(&k, &v) {
		if nv, ok := want[k]; !ok || nv != v {
			if !ok {
				stale = append(stale, k)
			}
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read allow map: %w", err)
	}
	// Add before removing: a destination allowed before and after never
	// sees a gap.
	for k, v := range want {
		if err := m.Put(k, v); err != nil {
			return fmt.Errorf("update allow map: %w", err)
		}
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("update allow map: %w", err)
		}
	}
	return nil
}

// clearMap deletes every key of a hash map.
func clearMap(m *ebpf.Map) error {
	var keys []flowKey
	var k flowKey
	var v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}
