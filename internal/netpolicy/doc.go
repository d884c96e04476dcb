// Package netpolicy owns sandbox networking: the node side (a bridge with
// NAT in the node's network namespace), a pool of pre-made sandbox network
// namespaces wired into it by veth pairs, the eBPF programs and maps on each
// sandbox's cgroup v2 directory that decide every connect, send and packet,
// and the DNS proxy that is a sandbox's only resolver and writes the
// addresses of allowed names into that sandbox's maps before it answers.
// It imports errdefs, the backend package's types (NetworkStats) and the
// libraries it drives (cilium/ebpf, netlink, nftables, miekg/dns); never a
// backend implementation, the node or the API layers (internal/deptest).
package netpolicy
