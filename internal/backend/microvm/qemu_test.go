package microvm

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"
)

// TestDialAgentHandshake: a QEMU agent port is dialled with the port
// handshake when the machine's agent takes it, and without when it was
// restored from a snapshot of an agent from before it.
func TestDialAgentHandshake(t *testing.T) {
	for _, handshake := range []bool{true, false} {
		m := &machine{dir: t.TempDir(), machineState: machineState{PortHandshake: handshake}}
		l, err := net.Listen("unix", m.path(agentSock))
		if err != nil {
			t.Fatal(err)
		}
		first := make(chan []byte, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				first <- nil
				return
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			b := make([]byte, 16)
			n, _ := c.Read(b)
			first <- b[:n]
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		conn, err := (&qemu{}).DialAgent(ctx, m)
		cancel()
		got := <-first
		l.Close()
		sentSync := bytes.HasPrefix(got, []byte("\xffcrlSYNC"))
		switch {
		case handshake && (err == nil || !sentSync):
			t.Errorf("handshake: dial %v, first bytes %q; want a Sync and, with no agent answering, the deadline", err, got)
		case !handshake && (err != nil || len(got) != 0):
			t.Errorf("no handshake: dial %v, first bytes %q; want a plain connection", err, got)
		}
		if conn != nil {
			conn.Close()
		}
	}
}
