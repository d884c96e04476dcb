// Package probeproto is what corral-probe (the red-team suite's attacker
// inside a sandbox) reads on stdin and prints, one JSON value or line per
// mode: the suite, the benchmarks and the probe decode the same types.
// It imports nothing, so the probe stays a program that knows nothing of
// corral's internals.
package probeproto

// Input is what the suite passes on stdin: secrets never appear in argv or
// the environment, where the probe's own search would find them.
type Input struct {
	// Canaries are strings planted outside the sandbox (node log, config,
	// environment, another sandbox) that must not be readable inside.
	Canaries []string `json:"canaries"`
	// Sockets are host paths of sockets the node uses (its API socket,
	// init control sockets): connecting to them must fail.
	Sockets []string `json:"sockets"`
	// Pids are host pids of processes outside this sandbox.
	Pids []int `json:"pids"`
}

// Result is one attempt's outcome, one JSON line.
type Result struct {
	Name    string `json:"name"`
	Outcome string `json:"outcome"`
	Errno   string `json:"errno,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

// NetInput is what the suite passes to "net" on stdin: the test network's
// addresses, so that the probe needs to know nothing about it.
type NetInput struct {
	// Resolver is the sandbox's DNS server (the node's proxy), "ip:53".
	Resolver string `json:"resolver"`
	// AllowedName is a name the sandbox's rules allow; AllowedURL a URL on
	// it.
	AllowedName string `json:"allowed_name"`
	AllowedURL  string `json:"allowed_url"`
	// DeniedName resolves upstream, but no rule allows it.
	DeniedName string `json:"denied_name"`
	// DeniedTCP are "ip:port" of a host no rule allows (IPv4 and IPv6).
	DeniedTCP  []string `json:"denied_tcp"`
	DeniedTCP6 []string `json:"denied_tcp6"`
	DeniedUDP  string   `json:"denied_udp"`
	DeniedICMP string   `json:"denied_icmp"`
	// NodeAddrs are the node's own addresses (gateway, uplink); every port
	// but the DNS proxy's must be closed.
	NodeAddrs []string `json:"node_addrs"`
	// Upstream is the resolver the node's proxy asks, "ip:53".
	Upstream string `json:"upstream"`
}

// FloodInput is what "dnsflood" reads on stdin: one attack on the node's
// services (issue 21, findings 1, 2 and 8).
type FloodInput struct {
	// Kind: "tcp" holds Conns TCP connections to Resolver, a query on
	// each every two seconds; "udp" sends queries for distinct names
	// under Suffix as fast as it can from one socket; "udp-wait" does so
	// from Conns sockets, each waiting (up to a second) for the answer
	// before its next query, as resolver libraries do; "ports" sends one
	// UDP datagram to Target from each of Conns fresh source ports.
	Kind     string  `json:"kind"`
	Resolver string  `json:"resolver"`
	Target   string  `json:"target,omitempty"`
	Suffix   string  `json:"suffix,omitempty"`
	Conns    int     `json:"conns,omitempty"`
	Seconds  float64 `json:"seconds"`
}

// FloodResult is the one JSON line "dnsflood" prints.
type FloodResult struct {
	Sent     int64  `json:"sent"`
	Answered int64  `json:"answered"`
	Opened   int64  `json:"opened,omitempty"`    // TCP connections established
	Closed   int64  `json:"closed,omitempty"`    // TCP connections the proxy closed
	Errors   int64  `json:"errors,omitempty"`    // failed connects or sends
	FirstErr string `json:"first_err,omitempty"` // the first of them
}

// LoadResult is what "httpload" prints: requests that got a 200 and those
// that failed, over Seconds.
type LoadResult struct {
	Requests int64   `json:"requests"`
	Errors   int64   `json:"errors"`
	Seconds  float64 `json:"seconds"`
	PerS     float64 `json:"per_s"`
	FirstErr string  `json:"first_error,omitempty"`
}
