package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/probeproto"
)

// netAttempts are the network rows: each is "blocked" when refused (errno
// EPERM from the eBPF programs, or REFUSED from the DNS proxy).
func netAttempts(in probeproto.NetInput) {
	attempt("net/allowed-name", func() []probeproto.Result {
		// The one row that must succeed: a name the rules allow.
		rcode, _, err := dnsQuery(in.Resolver, in.AllowedName, 1)
		if err == nil && rcode != 0 {
			err = rcodeErr(rcode)
		}
		if err == nil {
			err = httpGet(in.AllowedURL)
		}
		return one(fromErr("net/allowed-name", err, in.AllowedName))
	})
	attempt("net/denied-name-dns", func() []probeproto.Result {
		rcode, _, err := dnsQuery(in.Resolver, in.DeniedName, 1)
		if err == nil && rcode != 0 {
			err = rcodeErr(rcode)
		}
		return one(fromErr("net/denied-name-dns", err, in.DeniedName))
	})
	attempt("net/denied-ip", func() []probeproto.Result { return dialAll("net/denied-ip", "tcp", in.DeniedTCP) })
	attempt("net/denied-ipv6", func() []probeproto.Result { return dialAll("net/denied-ipv6", "tcp", in.DeniedTCP6) })
	attempt("net/denied-udp", func() []probeproto.Result {
		pc, err := net.ListenPacket("udp", ":0")
		if err == nil {
			defer pc.Close()
			var to *net.UDPAddr
			if to, err = net.ResolveUDPAddr("udp", in.DeniedUDP); err == nil {
				_, err = pc.WriteTo([]byte("probe"), to)
			}
		}
		return one(fromErr("net/denied-udp", err, in.DeniedUDP))
	})
	attempt("net/denied-icmp", func() []probeproto.Result {
		return one(fromErr("net/denied-icmp", ping(in.DeniedICMP), in.DeniedICMP))
	})
	attempt("net/scan-node", func() []probeproto.Result {
		var targets []string
		for _, a := range in.NodeAddrs {
			for _, p := range []string{"22", "80", "443", "2379", "6443", "7070", "8080"} {
				targets = append(targets, net.JoinHostPort(a, p))
			}
		}
		return dialAll("net/scan-node", "tcp", targets)
	})
	attempt("net/scan-node-icmp", func() []probeproto.Result {
		var rs []probeproto.Result
		for _, a := range in.NodeAddrs {
			if !strings.Contains(a, ":") {
				rs = append(rs, fromErr("net/scan-node-icmp", ping(a), a))
			}
		}
		return rs
	})
	attempt("net/scan-private", func() []probeproto.Result {
		return dialAll("net/scan-private", "tcp", []string{"10.0.0.1:80", "172.16.0.1:80", "192.168.0.1:80",
			"100.64.0.1:80", "[fd00::1]:80"})
	})
	attempt("net/metadata", func() []probeproto.Result {
		return dialAll("net/metadata", "tcp", []string{"169.254.169.254:80", "[fd00:ec2::254]:80"})
	})
	attempt("net/dns-other-resolver", func() []probeproto.Result {
		_, _, err := dnsQuery(in.Upstream, in.DeniedName, 1)
		return one(fromErr("net/dns-other-resolver", err, in.Upstream))
	})
	attempt("net/dns-tunnel-txt", func() []probeproto.Result {
		// Tunnels ride on TXT answers; even for an allowed name the proxy
		// must not relay them.
		rcode, _, err := dnsQuery(in.Resolver, "x1f3a."+in.AllowedName, 16)
		if err == nil {
			err = rcodeErr(rcode)
		}
		return one(fromErr("net/dns-tunnel-txt", err, in.AllowedName))
	})
}

// dialAll connects to every target; any success is a "succeeded" row.
func dialAll(name, network string, targets []string) []probeproto.Result {
	var rs []probeproto.Result
	for _, t := range targets {
		c, err := net.DialTimeout(network, t, 2*time.Second)
		if err == nil {
			c.Close()
		}
		rs = append(rs, fromErr(name, err, t))
	}
	return rs
}

// rcodeError is a DNS refusal, reported as its rcode name.
type rcodeError int

func (e rcodeError) Error() string {
	switch e {
	case 0:
		return "NOERROR"
	case 2:
		return "SERVFAIL"
	case 3:
		return "NXDOMAIN"
	case 5:
		return "REFUSED"
	}
	return fmt.Sprintf("RCODE%d", int(e))
}

func rcodeErr(rcode int) error {
	if rcode == 0 {
		return nil
	}
	return rcodeError(rcode)
}

// dnsQuery sends one query over UDP and returns the reply's rcode and
// answer count.
func dnsQuery(server, name string, qtype uint16) (rcode, answers int, err error) {
	c, err := net.DialTimeout("udp", server, 2*time.Second)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	msg := []byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0} // id, RD, one question
	for _, l := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		msg = append(msg, byte(len(l)))
		msg = append(msg, l...)
	}
	msg = append(msg, 0)
	msg = binary.BigEndian.AppendUint16(msg, qtype)
	msg = binary.BigEndian.AppendUint16(msg, 1) // IN
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return 0, 0, err
	}
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		return 0, 0, err
	}
	if n < 12 || buf[0] != 0x12 || buf[1] != 0x34 {
		return 0, 0, errors.New("malformed reply")
	}
	return int(buf[3] & 0x0f), int(binary.BigEndian.Uint16(buf[6:8])), nil
}

func httpGet(url string) error {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %s", resp.Status)
	}
	return err
}

// ping sends one ICMP echo on a ping socket (raw sockets are refused in a
// sandbox) and waits a second for the reply.
func ping(addr string) error {
	ip := net.ParseIP(addr).To4()
	if ip == nil {
		return fmt.Errorf("not an IPv4 address: %q", addr)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	echo := []byte{8, 0, 0, 0, 0, 1, 0, 1, 'p', 'r', 'o', 'b', 'e'} // the kernel fills id and checksum
	sa := &unix.SockaddrInet4{}
	copy(sa.Addr[:], ip)
	if err := unix.Sendto(fd, echo, 0, sa); err != nil {
		return err
	}
	tv := unix.Timeval{Sec: 1}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return err
	}
	if _, _, err := unix.Recvfrom(fd, make([]byte, 512), 0); err != nil {
		return fmt.Errorf("no reply: %w", err)
	}
	return nil
}
