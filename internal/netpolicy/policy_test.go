package netpolicy

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	for in, want := range map[string]string{
		"pypi":                     "pypi",
		"Example.org:443":          "example.org:443",
		"*.example.org":            "*.example.org",
		"203.0.113.0/24:80,443":    "203.0.113.0/24:80,443",
		"[2001:db8::/32]:443":      "[2001:db8::/32]:443",
		"2001:db8::1":              "2001:db8::1",
		"198.51.100.7:53/udp":      "198.51.100.7:53/udp",
		"198.51.100.7/icmp":        "198.51.100.7/icmp",
		"10.0.0.0/8:8000-8100":     "10.0.0.0/8:8000-8100",
		"host.test:1/tcp+udp":      "host.test:1",
		"[2001:db8::1]:53/udp+tcp": "[2001:db8::1]:53",
	} {
		r, err := ParseRule(in)
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if r.String() != want {
			t.Errorf("%q: canonical %q, want %q", in, r.String(), want)
		}
	}
	for in, wantErr := range map[string]string{
		"":                         "empty",
		"example.org:0":            "not in 1-65535",
		"example.org:70000":        "not in 1-65535",
		"example.org:90-80":        "FIRST-LAST",
		"10.0.0.1/8":               "host bits",
		"*.org":                    "wildcard",
		"exa mple.org":             "DNS label",
		"pypi:443":                 "preset takes no ports",
		"1.2.3":                    "bad address",
		"example.org/sctp":         "protocol \"sctp\"",
		"[2001:db8::1":             "missing ]",
		"a.test:1,2,3,4,5,6,7,8,9": "at most 8",
	} {
		_, err := ParseRule(in)
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%q: error %v, want one containing %q", in, err, wantErr)
		}
	}
}

func TestValidateNamesField(t *testing.T) {
	_, err := Validate(Policy{Mode: ModeAllowlist, Allow: []string{"pypi", "nosuch"}}, DefaultPresets())
	if err == nil || !strings.Contains(err.Error(), "network.allow[1]") || !strings.Contains(err.Error(), "unknown preset") {
		t.Errorf("unknown preset: %v", err)
	}
	_, err = Validate(Policy{Mode: "closed"}, nil)
	if err == nil || !strings.Contains(err.Error(), "network.mode") {
		t.Errorf("bad mode: %v", err)
	}
	_, err = Validate(Policy{Mode: ModeNone, Allow: []string{"a.test"}}, nil)
	if err == nil || !strings.Contains(err.Error(), "network.allow") {
		t.Errorf("rules with mode none: %v", err)
	}
	rules, err := Validate(Policy{Mode: ModeAllowlist, Allow: []string{"pypi"}}, DefaultPresets())
	if err != nil || len(rules) != 2 || !rules[0].Matches("pypi.org") {
		t.Errorf("preset expansion: %v %+v", err, rules)
	}
}

func TestBuildTableDeniedRanges(t *testing.T) {
	all := []entry{{0, 65535, uint32(protoAll)}}
	p := func(s string) item { r, _ := ParseRule(s); return item{to16(r.Prefix), all} }
	deny := []netip.Prefix{to16(netip.MustParsePrefix("10.0.0.0/8"))}
	table, err := buildTable([]item{p("0.0.0.0/0"), p("10.1.0.0/16")}, deny)
	if err != nil {
		t.Fatal(err)
	}
	get := func(s string) lpmValue {
		pr := to16(netip.MustParsePrefix(s))
		return table[lpmKey{uint32(pr.Bits()), pr.Addr().As16()}]
	}
	if get("10.0.0.0/8")[0].Protos != 0 {
		t.Error("0.0.0.0/0 opened the denied 10.0.0.0/8")
	}
	if get("10.1.0.0/16")[0].Protos == 0 {
		t.Error("10.1.0.0/16, listed by itself, stays closed")
	}
	if get("0.0.0.0/0")[0].Protos == 0 {
		t.Error("0.0.0.0/0 is closed")
	}
}
