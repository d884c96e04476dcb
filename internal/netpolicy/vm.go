package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Guest is what a microVM's agent configures on its eth0.
type Guest struct {
	MAC      net.HardwareAddr
	Addr4    netip.Prefix
	Addr6    netip.Prefix
	Gateway4 netip.Addr
	Gateway6 netip.Addr
}

// tapName is the VM's tap inside its own namespace.
const tapName = "tap0"

// AttachVM gives microVM id a namespace from the pool, rewired for a
// guest kernel: eth0 loses its addresses (the guest holds them) and joins
// a bridge with a tap whose fd Sandbox.Tap returns for the VMM. The tc
// program on the node-side veth enforces p from the first frame on. On
// error nothing remains.
func (m *Manager) AttachVM(ctx context.Context, id string, p Policy) (*Sandbox, error) {
	sb, s, err := m.attach(ctx, id, p, true)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Sandbox, error) {
		if sb.tap != nil {
			sb.tap.Close()
		}
		m.freeSlot(s)
		return nil, fmt.Errorf("network: %w", err)
	}
	var nsMAC net.HardwareAddr
	if sb.tap, nsMAC, err = rewireForGuest(s); err != nil {
		return fail(err)
	}
	if err := sb.sync(); err != nil {
		return fail(err)
	}
	g := guestIdentity{MAC: guestMAC(s.index), Addr4: s.addr4, Addr6: s.addr6, NetnsMAC: nsMAC}
	if err := s.filter.attachTap(m.node, s.hostVeth, g); err != nil {
		return fail(err)
	}
	m.register(sb)
	return sb, nil
}

// Tap is the VM's tap device (nil for containers and after a restart);
// it stays the sandbox's, the VMM gets a duplicate.
func (s *Sandbox) Tap() *os.File { return s.tap }

// Guest is the configuration of the VM's eth0.
func (s *Sandbox) Guest() Guest {
	gw4, gw6 := s.m.gateways()
	return Guest{MAC: guestMAC(s.index), Addr4: netip.PrefixFrom(s.addr4, gw4.Bits()),
		Addr6: netip.PrefixFrom(s.addr6, gw6.Bits()), Gateway4: gw4.Addr(), Gateway6: gw6.Addr()}
}

// rewireForGuest turns a container slot into a VM slot: eth0 without
// addresses in a bridge with a new tap. It returns the tap's fd and
// eth0's MAC.
func rewireForGuest(s *slot) (*os.File, net.HardwareAddr, error) {
	in, err := handleIn(s.ns)
	if err != nil {
		return nil, nil, fmt.Errorf("netlink in sandbox netns: %w", err)
	}
	defer in.Close()
	eth, err := in.LinkByName("eth0")
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox eth0: %w", err)
	}
	addrs, err := in.AddrList(eth, unix.AF_UNSPEC)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox eth0 addresses: %w", err)
	}
	for _, a := range addrs {
		if err := in.AddrDel(eth, &a); err != nil {
			return nil, nil, fmt.Errorf("sandbox eth0: remove %s: %w", a.IPNet, err)
		}
	}
	var tap *os.File
	err = InNetns(s.ns, func() error {
		// The namespace's own links say nothing on the wire: only the
		// guest's frames leave it (and its link-local NDP would be dropped
		// as spoofed anyway).
		for _, name := range []string{"default", "eth0"} {
			if err := writeSysctl("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", "1"); err != nil {
				return err
			}
		}
		var err error
		tap, err = openTap(tapName)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	la := netlink.NewLinkAttrs()
	// The bridge's own frames (it gets an IPv4 stack whether it wants one
	// or not) carry eth0's MAC, which the tap program drops uncounted;
	// with a random MAC of its own they counted as the guest's forgeries.
	la.Name, la.HardwareAddr = "br0", eth.Attrs().HardwareAddr
	br := &netlink.Bridge{LinkAttrs: la}
	err = errors.Join(
		in.LinkAdd(br),
		in.LinkSetMaster(eth, br),
		setMasterUp(in, tapName, br),
		in.LinkSetUp(br))
	if err != nil {
		tap.Close()
		return nil, nil, fmt.Errorf("sandbox bridge: %w", err)
	}
	return tap, eth.Attrs().HardwareAddr, nil
}

func setMasterUp(in *netlink.Handle, name string, br *netlink.Bridge) error {
	l, err := in.LinkByName(name)
	if err != nil {
		return err
	}
	return errors.Join(in.LinkSetMaster(l, br), in.LinkSetUp(l))
}

// openTap creates tap name in the calling thread's namespace and returns
// its fd (the device goes when the last fd closes).
func openTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	var req [unix.IFNAMSIZ + 64]byte
	copy(req[:], name)
	*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("create tap %s: %w", name, errno)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}

// attachTap loads the tap program on the slot's maps and attaches it to
// the ingress of the node-side veth. The attachment (tcx, not a bpf_link)
// stays while the veth exists: through a daemon restart, gone with it.
func (f *filter) attachTap(n *nodeSide, hostVeth string, g guestIdentity) error {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: tapProgramName, Type: ebpf.SchedCLS,
		Instructions: tapProgram(f.maps, g), License: "Apache-2.0"})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("load %s: %+v", tapProgramName, ve)
		}
		return fmt.Errorf("load %s: %w", tapProgramName, err)
	}
	f.progs = append(f.progs, p)
	l, err := n.nl.LinkByName(hostVeth)
	if err != nil {
		return fmt.Errorf("veth %s: %w", hostVeth, err)
	}
	return InNetns(n.ns, func() error {
		err := link.RawAttachProgram(link.RawAttachProgramOptions{
			Target: l.Attrs().Index, Program: p, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return fmt.Errorf("attach %s to %s ingress: %w", tapProgramName, hostVeth, err)
		}
		return nil
	})
}

// recoverTapFilter finds the maps of the tap program on hostVeth.
func recoverTapFilter(n *nodeSide, hostVeth string) (*filter, error) {
	l, err := n.nl.LinkByName(hostVeth)
	if err != nil {
		return nil, fmt.Errorf("veth %s: %w", hostVeth, err)
	}
	var res *link.QueryResult
	err = InNetns(n.ns, func() error {
		var err error
		res, err = link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("query programs of %s: %w", hostVeth, err)
	}
	return mapsOfProgram(res, tapProgramName, hostVeth)
}
