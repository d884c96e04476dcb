package netpolicy

import (
	"net/netip"
	"testing"
	"time"
)

// TestTokenBucket: a sandbox gets its burst at once, then its rate.
func TestTokenBucket(t *testing.T) {
	l := DNSLimits{Rate: 10, Burst: 20}.withDefaults()
	var s sandboxLimits
	now := time.Now()
	n := 0
	for range 100 {
		if s.allow(now, &l) {
			n++
		}
	}
	if n != 20 {
		t.Fatalf("at once: %d allowed, want the burst of 20", n)
	}
	if s.allow(now.Add(50*time.Millisecond), &l) {
		t.Fatal("half a token later: allowed")
	}
	if !s.allow(now.Add(150*time.Millisecond), &l) {
		t.Fatal("a token and a half later: refused")
	}
}

// TestKeyValueMatchesBuildTable: the value written for one learned
// address is the one a rebuild of the whole table would give it.
func TestKeyValueMatchesBuildTable(t *testing.T) {
	all := []entry{{First: 0, Last: 65535, Protos: uint32(protoAll)}}
	web := []entry{{First: 443, Last: 443, Protos: uint32(ProtoTCP)}}
	host := func(s string) netip.Prefix {
		a := netip.MustParseAddr(s)
		return to16(netip.PrefixFrom(a, a.BitLen()))
	}
	static := []item{
		{to16(netip.MustParsePrefix("0.0.0.0/0")), all},
		{to16(netip.MustParsePrefix("203.0.113.0/24")), web},
	}
	deny := []netip.Prefix{to16(netip.MustParsePrefix("10.0.0.0/8"))}
	for _, a := range []string{"203.0.113.7", "10.1.2.3", "198.51.100.1"} {
		items := append(append([]item{}, static...), item{host(a), web})
		table, _ := buildTable(items, deny)
		got, _ := keyValue(host(a), items, deny)
		if want := table[lpmKeyOf(host(a))]; got != want {
			t.Errorf("%s: keyValue %v, buildTable %v", a, got, want)
		}
	}
}
