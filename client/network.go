package client

import (
	"context"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// NetworkMode is a sandbox's network mode.
type NetworkMode string

const (
	// NetworkNone: loopback only (the default).
	NetworkNone NetworkMode = "none"
	// NetworkAllowlist: only the destinations in Network.Allow, and the
	// node's DNS proxy for the names among them.
	NetworkAllowlist NetworkMode = "allowlist"
	// NetworkOpen: everything but the node, link-local/metadata and
	// private ranges (unless listed in Allow).
	NetworkOpen NetworkMode = "open"
)

var modeToProto = map[NetworkMode]corralv1.NetworkMode{
	"":               corralv1.NetworkMode_NETWORK_MODE_UNSPECIFIED,
	NetworkNone:      corralv1.NetworkMode_NETWORK_MODE_NONE,
	NetworkAllowlist: corralv1.NetworkMode_NETWORK_MODE_ALLOWLIST,
	NetworkOpen:      corralv1.NetworkMode_NETWORK_MODE_OPEN,
}

// Network is a sandbox's network policy. Allow rules are
// "TARGET[:PORTS][/PROTOCOLS]": a server preset ("pypi", "npm", "github",
// "goproxy"), a name ("example.org:443", "*.example.org"), an address or
// prefix ("203.0.113.0/24:80,443", "[2001:db8::/32]:443"), with protocols
// tcp, udp, icmp joined by "+" (tcp+udp when absent). The server checks
// them; an error names the rule.
type Network struct {
	Mode  NetworkMode
	Allow []string
}

func (n Network) toProto() *corralv1.NetworkPolicy {
	m, ok := modeToProto[n.Mode]
	if !ok {
		m = corralv1.NetworkMode(-1) // the server names the field
	}
	if n.Mode == "" && len(n.Allow) > 0 {
		m = corralv1.NetworkMode_NETWORK_MODE_ALLOWLIST // rules imply an allowlist
	}
	return &corralv1.NetworkPolicy{Mode: m, Allow: n.Allow}
}

func networkFromProto(p *corralv1.NetworkPolicy) Network {
	n := Network{Mode: NetworkNone, Allow: p.GetAllow()}
	for mode, pm := range modeToProto {
		if pm == p.GetMode() && mode != "" {
			n.Mode = mode
		}
	}
	return n
}

// NetworkUpdate changes a running sandbox's network policy.
type NetworkUpdate struct {
	Mode    NetworkMode // "" keeps the mode
	Allow   []string    // added to the allow list
	Deny    []string    // removed from it
	Replace bool        // Allow replaces the list
}

// UpdateNetwork applies u and returns the policy now in force (it is in
// force when the call returns).
func (s *Sandbox) UpdateNetwork(ctx context.Context, u NetworkUpdate) (Network, error) {
	m, ok := modeToProto[u.Mode]
	if !ok {
		m = corralv1.NetworkMode(-1)
	}
	resp, err := s.c.svc.UpdateNetwork(ctx, connect.NewRequest(&corralv1.UpdateNetworkRequest{
		Id: s.id, Mode: m, Allow: u.Allow, Deny: u.Deny, Replace: u.Replace,
	}))
	if err != nil {
		return Network{}, wrapErr(err)
	}
	return networkFromProto(resp.Msg.Network), nil
}

// NetworkRefusal is one refused destination, or a refused name (Hook "dns").
type NetworkRefusal struct {
	Address  string
	Port     uint32
	Protocol string // tcp, udp, icmp or a protocol number
	Hook     string // connect, sendmsg, egress or dns
	Name     string
	Count    uint64
}

// NetworkStats are a sandbox's refused attempts.
type NetworkStats struct {
	// RefusedTotal counts every refused connect, send and packet.
	RefusedTotal uint64
	Refusals     []NetworkRefusal
}

// NetworkStats reads the sandbox's refused attempts.
func (s *Sandbox) NetworkStats(ctx context.Context) (*NetworkStats, error) {
	resp, err := s.c.svc.NetworkStats(ctx, connect.NewRequest(&corralv1.NetworkStatsRequest{Id: s.id}))
	if err != nil {
		return nil, wrapErr(err)
	}
	st := &NetworkStats{RefusedTotal: resp.Msg.RefusedTotal}
	for _, r := range resp.Msg.Refusals {
		st.Refusals = append(st.Refusals, NetworkRefusal{Address: r.Address, Port: r.Port, Protocol: r.Protocol,
			Hook: r.Hook, Name: r.Name, Count: r.Count})
	}
	return st, nil
}
