package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Mode is a sandbox's network mode.
type Mode string

const (
	// ModeNone: loopback only, no interface at all (the default).
	ModeNone Mode = "none"
	// ModeAllowlist: only the listed destinations (and the node's DNS proxy).
	ModeAllowlist Mode = "allowlist"
	// ModeOpen: everything except the always-denied ranges.
	ModeOpen Mode = "open"
)

// ParseMode accepts "", "none", "allowlist" and "open" ("" is none).
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeNone:
		return ModeNone, nil
	case ModeAllowlist, ModeOpen:
		return Mode(s), nil
	}
	return "", errdefs.InvalidArgument("network.mode: %q is not none, allowlist or open", s)
}

// Policy is one sandbox's network policy as the caller gave it.
type Policy struct {
	Mode Mode
	// Allow are rules in the syntax of ParseRule (presets unexpanded).
	Allow []string
}

// Proto is a bit set of transport protocols.
type Proto uint32

const (
	ProtoTCP  Proto = 1 << 0
	ProtoUDP  Proto = 1 << 1
	ProtoICMP Proto = 1 << 2 // ICMP and ICMPv6 echo (ping sockets)
	// ProtoOther is any other IP protocol (only open mode allows it).
	ProtoOther Proto = 1 << 3
	protoAll         = ProtoTCP | ProtoUDP | ProtoICMP | ProtoOther
)

var protoNames = map[string]Proto{"tcp": ProtoTCP, "udp": ProtoUDP, "icmp": ProtoICMP}

func (p Proto) String() string {
	var out []string
	for _, n := range []string{"tcp", "udp", "icmp"} {
		if p&protoNames[n] != 0 {
			out = append(out, n)
		}
	}
	if p&ProtoOther != 0 {
		out = append(out, "other")
	}
	return strings.Join(out, "+")
}

// PortRange is an inclusive range of ports.
type PortRange struct{ First, Last uint16 }

var anyPort = PortRange{0, 65535}

// Rule is one parsed allow rule: exactly one of Preset, Domain and Prefix.
type Rule struct {
	Preset string
	// Domain is a lower-case name; "*.example.org" matches every name
	// below example.org (not example.org itself).
	Domain string
	Prefix netip.Prefix
	// Ports are empty for every port.
	Ports []PortRange
	// Protos default to tcp+udp.
	Protos Proto
}

// maxPortRanges bounds the ranges of one rule, and of one address once
// every rule covering it is merged: the eBPF programs check a fixed number
// of ranges per address.
const maxPortRanges = 8

// maxRules bounds a policy's rules.
const maxRules = 256

// ParseRule parses one allow rule, "TARGET[:PORTS][/PROTOCOLS]":
//
//	pypi                     a preset of the node
//	example.org:443          a name (DNS answers for it are allowed)
//	*.example.org            every name below example.org
//	203.0.113.0/24:80,443    an IPv4 prefix or address, ports
//	[2001:db8::/32]:443      an IPv6 prefix or address (brackets with ports)
//	2001:db8::1              an IPv6 address without ports
//	198.51.100.7:53/udp      protocols: tcp, udp, icmp joined by "+"
//
// PORTS is a comma-separated list of ports and ranges ("8000-8100").
func ParseRule(s string) (Rule, error) {
	orig := s
	bad := func(format string, args ...any) (Rule, error) {
		return Rule{}, fmt.Errorf("%q: %s", orig, fmt.Sprintf(format, args...))
	}
	s = strings.TrimSpace(strings.ToLower(s))
	if s == "" {
		return bad("empty rule")
	}
	var r Rule
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		if suffix := s[i+1:]; suffix != "" && strings.Trim(suffix, "abcdefghijklmnopqrstuvwxyz+") == "" {
			for _, n := range strings.Split(s[i+1:], "+") {
				p, ok := protoNames[n]
				if !ok {
					return bad("protocol %q is not tcp, udp or icmp", n)
				}
				r.Protos |= p
			}
			s = s[:i]
		}
	}
	target, ports := s, ""
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return bad("missing ]")
		}
		target, ports = s[1:end], s[end+1:]
		if ports != "" && !strings.HasPrefix(ports, ":") {
			return bad("expected :PORTS after ]")
		}
		ports = strings.TrimPrefix(ports, ":")
	case strings.Count(s, ":") == 1:
		target, ports, _ = strings.Cut(s, ":")
	}
	if ports != "" || strings.HasSuffix(s, ":") {
		for _, p := range strings.Split(ports, ",") {
			pr, err := parsePortRange(p)
			if err != nil {
				return bad("%v", err)
			}
			r.Ports = append(r.Ports, pr)
		}
		if len(r.Ports) > maxPortRanges {
			return bad("%d port ranges, at most %d", len(r.Ports), maxPortRanges)
		}
	}
	lastLabel := target[strings.LastIndexByte(target, '.')+1:]
	switch {
	case strings.Contains(target, ":") || strings.Contains(target, "/") || lastLabel != "" && strings.Trim(lastLabel, "0123456789") == "":
		p, err := parsePrefix(target)
		if err != nil {
			return bad("%v", err)
		}
		r.Prefix = p
	case strings.Contains(target, "."):
		if err := checkDomain(target); err != nil {
			return bad("%v", err)
		}
		r.Domain = strings.TrimSuffix(target, ".")
	default:
		if !validLabel(target) {
			return bad("not a preset name, domain, address or prefix")
		}
		if len(r.Ports) > 0 || r.Protos != 0 {
			return bad("a preset takes no ports or protocols")
		}
		r.Preset = target
	}
	if r.Protos == 0 {
		r.Protos = ProtoTCP | ProtoUDP
	}
	return r, nil
}

func parsePortRange(s string) (PortRange, error) {
	a, b, isRange := strings.Cut(s, "-")
	first, err := strconv.ParseUint(a, 10, 16)
	if err != nil || first == 0 {
		return PortRange{}, fmt.Errorf("port %q is not in 1-65535", a)
	}
	last := first
	if isRange {
		if last, err = strconv.ParseUint(b, 10, 16); err != nil || last < first {
			return PortRange{}, fmt.Errorf("port range %q is not FIRST-LAST within 1-65535", s)
		}
	}
	return PortRange{uint16(first), uint16(last)}, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("bad prefix: %v", err)
		}
		if p != p.Masked() {
			return netip.Prefix{}, fmt.Errorf("prefix %s has host bits set (did you mean %s?)", p, p.Masked())
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("bad address: %v", err)
	}
	if a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("address %s has a zone", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func checkDomain(d string) error {
	d = strings.TrimSuffix(d, ".")
	if len(d) > 253 {
		return fmt.Errorf("name longer than 253 characters")
	}
	labels := strings.Split(d, ".")
	for i, l := range labels {
		if l == "*" && i == 0 && len(labels) > 2 {
			continue // a wildcard needs at least two labels under it
		}
		if !validLabel(l) {
			return fmt.Errorf("label %q is not a DNS label (a wildcard is a leading \"*.\" over at least two labels)", l)
		}
	}
	return nil
}

func validLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for _, c := range l {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// String is the canonical form of the rule (what ParseRule reads back).
func (r Rule) String() string {
	var b strings.Builder
	switch {
	case r.Preset != "":
		return r.Preset
	case r.Domain != "":
		b.WriteString(r.Domain)
	case r.Prefix.Addr().Is6() && len(r.Ports) > 0:
		b.WriteString("[" + prefixString(r.Prefix) + "]")
	default:
		b.WriteString(prefixString(r.Prefix))
	}
	for i, p := range r.Ports {
		b.WriteByte(",:"[min(i, 1)^1])
		b.WriteString(strconv.Itoa(int(p.First)))
		if p.Last != p.First {
			b.WriteString("-" + strconv.Itoa(int(p.Last)))
		}
	}
	if r.Protos != ProtoTCP|ProtoUDP {
		b.WriteString("/" + r.Protos.String())
	}
	return b.String()
}

func prefixString(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// Matches reports whether the rule's domain pattern covers name (lower case,
// no trailing dot).
func (r Rule) Matches(name string) bool {
	if r.Domain == "" {
		return false
	}
	if base, ok := strings.CutPrefix(r.Domain, "*."); ok {
		return strings.HasSuffix(name, "."+base)
	}
	return name == r.Domain
}

// portEntries are the (ports, protocols) a rule allows, in the programs'
// form.
func (r Rule) portEntries() []entry {
	ports := r.Ports
	if len(ports) == 0 {
		ports = []PortRange{anyPort}
	}
	var out []entry
	if p := r.Protos &^ ProtoICMP; p != 0 {
		for _, pr := range ports {
			out = append(out, entry{First: pr.First, Last: pr.Last, Protos: uint32(p)})
		}
	}
	if r.Protos&ProtoICMP != 0 {
		out = append(out, entry{First: 0, Last: 65535, Protos: uint32(ProtoICMP)})
	}
	return out
}

// Check is the one check of a policy as a caller gives it: the mode, the
// number of rules, no rules for mode none, and each rule's syntax (presets
// are not expanded). The node runs it on every create and update; errors
// name the field and the offending rule.
func Check(p Policy) error {
	mode, err := ParseMode(string(p.Mode))
	if err != nil {
		return err
	}
	if len(p.Allow) > maxRules {
		return errdefs.InvalidArgument("network.allow: %d rules, at most %d", len(p.Allow), maxRules)
	}
	if mode == ModeNone && len(p.Allow) > 0 {
		return errdefs.InvalidArgument("network.allow: mode none takes no rules (use allowlist)")
	}
	for i, s := range p.Allow {
		if _, err := ParseRule(s); err != nil {
			return errdefs.InvalidArgument("network.allow[%d]: %v", i, err)
		}
	}
	return nil
}

// Validate checks p (see Check), expands presets from presets and returns
// the rules.
func Validate(p Policy, presets map[string][]string) ([]Rule, error) {
	if err := Check(p); err != nil {
		return nil, err
	}
	var out []Rule
	for i, s := range p.Allow {
		r, _ := ParseRule(s) // Check parsed it
		if r.Preset == "" {
			out = append(out, r)
			continue
		}
		exp, ok := presets[r.Preset]
		if !ok {
			names := make([]string, 0, len(presets))
			for n := range presets {
				names = append(names, n)
			}
			slices.Sort(names)
			return nil, errdefs.InvalidArgument("network.allow[%d]: unknown preset %q (this node has %s)", i, r.Preset, strings.Join(names, ", "))
		}
		for _, e := range exp {
			pr, err := ParseRule(e)
			if err != nil || pr.Preset != "" {
				return nil, errdefs.InvalidArgument("network.allow[%d]: preset %q: bad rule %q: %v", i, r.Preset, e, err)
			}
			out = append(out, pr)
		}
	}
	return out, nil
}

// DefaultPresets are the presets of a node without its own: the public
// package registries' hosts on HTTPS.
func DefaultPresets() map[string][]string {
	return map[string][]string{
		"pypi":    {"pypi.org:443", "files.pythonhosted.org:443"},
		"npm":     {"registry.npmjs.org:443", "registry.yarnpkg.com:443"},
		"github":  {"github.com:443", "*.github.com:443", "*.githubusercontent.com:443", "codeload.github.com:443"},
		"goproxy": {"proxy.golang.org:443", "sum.golang.org:443", "storage.googleapis.com:443"},
	}
}
