package agent

import (
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// configureNetwork brings up lo and, for a networked sandbox, the NIC
// with the slot's addresses and default routes. The node's tc program
// drops frames with any other MAC or source address, so what the guest
// does here only decides whether its own traffic works.
func configureNetwork(cfg *agentproto.GuestNetwork) error {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("network: lo: %w", err)
	}
	if cfg == nil {
		return nil
	}
	mac, err := net.ParseMAC(cfg.MAC)
	if err != nil {
		return fmt.Errorf("network: mac %q: %w", cfg.MAC, err)
	}
	// No router advertisements or autoconfigured addresses: only the
	// slot's address is the guest's (others are dropped as spoofed).
	for _, k := range []string{"accept_ra", "autoconf", "accept_dad"} {
		for _, dev := range []string{"all", "default"} {
			_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+dev+"/"+k, []byte("0"), 0)
		}
	}
	// Ping sockets for every group, as in a container's namespace: ICMP
	// echo is then the policy's decision, not a missing capability.
	_ = os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte("0 2147483647"), 0)
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("network: list links: %w", err)
	}
	var nic netlink.Link
	for _, l := range links {
		if l.Attrs().HardwareAddr.String() == mac.String() {
			nic = l
		}
	}
	if nic == nil {
		return fmt.Errorf("network: no NIC with MAC %s (virtio_net not loaded?)", mac)
	}
	if nic.Attrs().Name != "eth0" {
		if err := netlink.LinkSetName(nic, "eth0"); err != nil {
			return fmt.Errorf("network: rename %s: %w", nic.Attrs().Name, err)
		}
	}
	for _, k := range []string{"accept_ra", "autoconf", "accept_dad"} {
		_ = os.WriteFile("/proc/sys/net/ipv6/conf/eth0/"+k, []byte("0"), 0)
	}
	if err := addressUp(nic, cfg, netlink.RouteAdd); err != nil {
		return err
	}
	logf("network: eth0 %s %s", cfg.Addr4, cfg.Addr6)
	return nil
}

// readdressNetwork moves a restored guest's eth0 to its new slot: the
// snapshot's MAC, addresses and neighbours (the old slot's) go, the new
// ones come. The link goes down and up again, so that its IPv6
// link-local address is derived from the new MAC as at boot.
func readdressNetwork(cfg *agentproto.GuestNetwork) error {
	mac, err := net.ParseMAC(cfg.MAC)
	if err != nil {
		return fmt.Errorf("network: mac %q: %w", cfg.MAC, err)
	}
	nic, err := netlink.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("network: eth0: %w", err)
	}
	if err := netlink.LinkSetDown(nic); err != nil {
		return fmt.Errorf("network: eth0 down: %w", err)
	}
	if err := netlink.LinkSetHardwareAddr(nic, mac); err != nil {
		return fmt.Errorf("network: eth0 mac %s: %w", mac, err)
	}
	addrs, err := netlink.AddrList(nic, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("network: eth0 addresses: %w", err)
	}
	for _, a := range addrs {
		if err := netlink.AddrDel(nic, &a); err != nil {
			return fmt.Errorf("network: remove %s: %w", a.IPNet, err)
		}
	}
	if err := addressUp(nic, cfg, netlink.RouteReplace); err != nil {
		return err
	}
	logf("network: eth0 readdressed %s %s", cfg.Addr4, cfg.Addr6)
	return nil
}

// addressUp gives nic the slot's addresses (no duplicate address
// detection: the slot's addresses are the guest's alone), brings it up and
// sets the default routes through the gateways with route (RouteAdd at
// boot, RouteReplace when a restored guest moves to a new slot).
func addressUp(nic netlink.Link, cfg *agentproto.GuestNetwork, route func(*netlink.Route) error) error {
	for _, a := range []string{cfg.Addr4, cfg.Addr6} {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return fmt.Errorf("network: address %q: %w", a, err)
		}
		addr.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrAdd(nic, addr); err != nil {
			return fmt.Errorf("network: eth0 address %s: %w", a, err)
		}
	}
	if err := netlink.LinkSetUp(nic); err != nil {
		return fmt.Errorf("network: eth0 up: %w", err)
	}
	for _, gw := range []string{cfg.Gateway4, cfg.Gateway6} {
		ip := net.ParseIP(gw)
		if ip == nil {
			return fmt.Errorf("network: gateway %q is not an address", gw)
		}
		if err := route(&netlink.Route{LinkIndex: nic.Attrs().Index, Gw: ip}); err != nil {
			return fmt.Errorf("network: default route via %s: %w", gw, err)
		}
	}
	return nil
}
