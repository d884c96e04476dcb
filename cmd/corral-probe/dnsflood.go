package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/probeproto"
)

func dnsFlood() {
	var in probeproto.FloodInput
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil || in.Seconds <= 0 || in.Seconds > 600 {
		fmt.Fprintln(os.Stderr, "corral-probe dnsflood: bad input (want a FloodInput, seconds in (0, 600]):", err)
		os.Exit(2)
	}
	// As many descriptors as the hard limit allows (an attacker would).
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil {
		rl.Cur = rl.Max
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &rl)
	}
	f := &flood{in: in, deadline: time.Now().Add(time.Duration(in.Seconds * float64(time.Second)))}
	switch in.Kind {
	case "tcp":
		f.tcp()
	case "udp":
		f.udp()
	case "udp-wait":
		f.udpWait()
	case "ports":
		f.ports()
	default:
		fmt.Fprintln(os.Stderr, "corral-probe dnsflood: unknown kind", in.Kind)
		os.Exit(2)
	}
	r := probeproto.FloodResult{Sent: f.sent.Load(), Answered: f.answered.Load(), Opened: f.opened.Load(), Closed: f.closed.Load(), Errors: f.errs.Load()}
	if e, ok := f.firstErr.Load().(string); ok {
		r.FirstErr = e
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
}

type flood struct {
	in                                   probeproto.FloodInput
	deadline                             time.Time
	sent, answered, opened, closed, errs atomic.Int64
	firstErr                             atomic.Value
}

func (f *flood) fail(err error) {
	f.errs.Add(1)
	f.firstErr.CompareAndSwap(nil, err.Error())
}

// query is a DNS query for name (type A, recursion desired).
func query(id uint16, name string) []byte {
	msg := binary.BigEndian.AppendUint16(nil, id)
	msg = append(msg, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0)
	for _, l := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		msg = append(msg, byte(len(l)))
		msg = append(msg, l...)
	}
	return append(msg, 0, 0, 1, 0, 1)
}

func (f *flood) tcp() {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64) // connects in parallel
	for i := 0; i < f.in.Conns && time.Now().Before(f.deadline); i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", f.in.Resolver, 3*time.Second)
			<-sem
			if err != nil {
				f.fail(err)
				return
			}
			defer c.Close()
			f.opened.Add(1)
			go func() { // answers, until the proxy closes the connection
				var hdr [2]byte
				for {
					if _, err := io.ReadFull(c, hdr[:]); err != nil {
						if time.Now().Before(f.deadline) {
							f.closed.Add(1)
						}
						return
					}
					if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint16(hdr[:]))); err != nil {
						return
					}
					f.answered.Add(1)
				}
			}()
			for n := 0; time.Now().Before(f.deadline); n++ {
				q := query(uint16(n), fmt.Sprintf("t%d-%d.%s", i, n, f.in.Suffix))
				if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
					return
				}
				f.sent.Add(1)
				time.Sleep(min(2*time.Second, time.Until(f.deadline)))
			}
		}()
	}
	wg.Wait()
}

func (f *flood) udp() {
	c, err := net.Dial("udp", f.in.Resolver)
	if err != nil {
		f.fail(err)
		return
	}
	defer c.Close()
	go func() {
		buf := make([]byte, 1500)
		for {
			if _, err := c.Read(buf); err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue // ECONNREFUSED and the like
			}
			f.answered.Add(1)
		}
	}()
	for n := 0; time.Now().Before(f.deadline); n++ {
		f.send(c, uint16(n), "u"+strconv.Itoa(n)+"."+f.in.Suffix)
	}
}

// send writes the query for name on c, counted as sent or as failed.
func (f *flood) send(c net.Conn, id uint16, name string) bool {
	if _, err := c.Write(query(id, name)); err != nil {
		f.fail(err)
		return false
	}
	f.sent.Add(1)
	return true
}

func (f *flood) udpWait() {
	var wg sync.WaitGroup
	for w := range max(f.in.Conns, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("udp", f.in.Resolver)
			if err != nil {
				f.fail(err)
				return
			}
			defer c.Close()
			buf := make([]byte, 1500)
			for n := 0; time.Now().Before(f.deadline); n++ {
				if !f.send(c, uint16(n), fmt.Sprintf("w%d-%d.%s", w, n, f.in.Suffix)) {
					continue
				}
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				if _, err := c.Read(buf); err == nil {
					f.answered.Add(1)
				}
			}
		}()
	}
	wg.Wait()
}

func (f *flood) ports() {
	to, err := net.ResolveUDPAddr("udp", f.in.Target)
	if err != nil {
		f.fail(err)
		return
	}
	for i := 0; i < f.in.Conns && time.Now().Before(f.deadline); i++ {
		c, err := net.DialUDP("udp", nil, to) // a fresh source port each time
		if err != nil {
			f.fail(err)
			continue
		}
		if _, err := c.Write(query(uint16(i), "p"+strconv.Itoa(i)+"."+f.in.Suffix)); err != nil {
			f.fail(err)
		} else {
			f.sent.Add(1)
		}
		c.Close()
	}
}

// dnsServer is the red-team suite's upstream resolver ("dnsserver
// ADDR"), run on the host in the test network, outside the daemon, so
// that the daemon's CPU is the proxy's alone. It answers every A query
// with one address derived from the name (TTL 60), names under slow.test
// only after 6 s (past the proxy's upstream timeout).
func dnsServer(addr string) {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "corral-probe dnsserver:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		q := append([]byte(nil), buf[:n]...)
		name, end, ok := questionName(q)
		if !ok {
			continue
		}
		if strings.HasSuffix(name, "slow.test") {
			go func() { time.Sleep(6 * time.Second); _, _ = pc.WriteTo(answerA(q, name, end), from) }()
			continue
		}
		_, _ = pc.WriteTo(answerA(q, name, end), from)
	}
}

// questionName parses the one question of q: its name and where the
// question ends.
func questionName(q []byte) (string, int, bool) {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:6]) != 1 {
		return "", 0, false
	}
	var labels []string
	i := 12
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if l > 63 || i+1+l > len(q) {
			return "", 0, false
		}
		labels = append(labels, string(q[i+1:i+1+l]))
		i += 1 + l
	}
	if i+5 > len(q) {
		return "", 0, false
	}
	return strings.ToLower(strings.Join(labels, ".")), i + 5, true
}

// answerA is the reply to q: one A record in 11.0.0.0/8 (public space no
// rule of the node denies) derived from name.
func answerA(q []byte, name string, end int) []byte {
	h := fnv.New32a()
	h.Write([]byte(name))
	v := h.Sum32()
	r := append([]byte(nil), q[:end]...)
	r[2], r[3] = 0x81, 0x80                  // response, RD, RA
	binary.BigEndian.PutUint16(r[6:8], 1)    // one answer
	binary.BigEndian.PutUint16(r[8:10], 0)   // no authority
	binary.BigEndian.PutUint16(r[10:12], 0)  // no additional
	r = append(r, 0xc0, 12, 0, 1, 0, 1)      // name pointer, A, IN
	r = binary.BigEndian.AppendUint32(r, 60) // TTL
	return append(r, 0, 4, 11, byte(v>>16), byte(v>>8), byte(v))
}
