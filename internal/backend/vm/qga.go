package vm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// qga is a client of the QEMU guest agent (qemu-ga) on the VM's
// virtio-serial port "org.qemu.guest_agent.0", whose host end is a unix
// socket. The protocol is QMP-like JSON lines without a greeting; the
// guest may hold replies of requests a previous client gave up on, so
// every connection starts with guest-sync-delimited and reads past
// everything before its marker (0xFF) and matching id.
type qga struct {
	path string

	mu   sync.Mutex
	conn net.Conn
	rd   *bufio.Reader
}

// qgaError is an error the guest agent returned for a command.
type qgaError struct {
	Cmd, Class, Desc string
}

func (e *qgaError) Error() string { return fmt.Sprintf("guest agent %s: %s", e.Cmd, e.Desc) }

// call runs one command; on any transport error the connection is
// dropped so the next call resynchronizes.
func (g *qga) call(ctx context.Context, cmd string, args any, out any) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn == nil {
		if err := g.connectLocked(ctx); err != nil {
			return err
		}
	}
	raw, err := g.roundTripLocked(ctx, cmd, args)
	if err != nil {
		if _, ok := err.(*qgaError); !ok {
			g.dropLocked()
		}
		return err
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("guest agent %s: decode reply: %w", cmd, err)
		}
	}
	return nil
}

func (g *qga) dropLocked() {
	if g.conn != nil {
		g.conn.Close()
		g.conn, g.rd = nil, nil
	}
}

func (g *qga) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dropLocked()
}

// connectLocked dials the socket and synchronizes with the guest.
func (g *qga) connectLocked(ctx context.Context) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", g.path)
	if err != nil {
		return errdefs.Unavailable("guest agent: connect: %v", err)
	}
	g.conn, g.rd = conn, bufio.NewReader(conn)
	id := rand.Int64N(1 << 50)
	g.setDeadline(ctx)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if err := g.send("guest-sync-delimited", map[string]any{"id": id}); err != nil {
		g.dropLocked()
		return errdefs.Unavailable("guest agent: sync: %v", err)
	}
	for {
		// Everything before the 0xFF the guest sends ahead of its sync
		// reply is a stale reply.
		if err := g.skipTo(0xff); err != nil {
			g.dropLocked()
			return errdefs.Unavailable("guest agent: sync: %v", ctxOr(ctx, err))
		}
		line, err := g.readLine()
		if err != nil {
			g.dropLocked()
			return errdefs.Unavailable("guest agent: sync: %v", ctxOr(ctx, err))
		}
		var r struct {
			Return int64 `json:"return"`
		}
		if json.Unmarshal(bytes.TrimSpace(line), &r) == nil && r.Return == id {
			return nil
		}
	}
}

func (g *qga) setDeadline(ctx context.Context) {
	if d, ok := ctx.Deadline(); ok {
		g.conn.SetDeadline(d)
	} else {
		g.conn.SetDeadline(time.Time{})
	}
}

func (g *qga) send(cmd string, args any) error {
	msg := map[string]any{"execute": cmd}
	if args != nil {
		msg["arguments"] = args
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	_, err = g.conn.Write(append(b, '\n'))
	return err
}

func (g *qga) roundTripLocked(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	g.setDeadline(ctx)
	conn := g.conn
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if err := g.send(cmd, args); err != nil {
		return nil, errdefs.Unavailable("guest agent %s: %v", cmd, ctxOr(ctx, err))
	}
	line, err := g.readLine()
	if err != nil {
		return nil, errdefs.Unavailable("guest agent %s: %v", cmd, ctxOr(ctx, err))
	}
	var r struct {
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Class string `json:"class"`
			Desc  string `json:"desc"`
		} `json:"error"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(bytes.TrimLeft(line, "\xff")), &r); err != nil {
		return nil, fmt.Errorf("guest agent %s: bad reply %q: %w", cmd, truncate(line, 200), err)
	}
	if r.Error != nil {
		return nil, &qgaError{Cmd: cmd, Class: r.Error.Class, Desc: r.Error.Desc}
	}
	return r.Return, nil
}

// maxReply bounds one reply of the guest, which the guest controls: two
// streams of captured output (qemu-ga caps each at 16 MiB) in base64.
// A variable for the test of a guest exceeding it.
var maxReply = 48 << 20

// readLine reads one reply line of at most maxReply bytes.
func (g *qga) readLine() ([]byte, error) {
	var line []byte
	for {
		frag, err := g.rd.ReadSlice('\n')
		if len(line)+len(frag) > maxReply {
			return nil, fmt.Errorf("reply over %d MiB", maxReply>>20)
		}
		line = append(line, frag...)
		if err != bufio.ErrBufferFull {
			return line, err
		}
	}
}

// skipTo discards input up to and including delim, at most maxReply bytes.
func (g *qga) skipTo(delim byte) error {
	for n := 0; n < maxReply; n++ {
		b, err := g.rd.ReadByte()
		if err != nil {
			return err
		}
		if b == delim {
			return nil
		}
	}
	return fmt.Errorf("no sync marker in %d MiB", maxReply>>20)
}

func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// ping asks the agent for guest-ping within wait: attempts are short
// while the guest boots (bytes sent before it opened its port are lost),
// and the caller lengthens them, as a loaded host may answer slowly.
func (g *qga) ping(ctx context.Context, wait time.Duration) error {
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	err := g.call(actx, "guest-ping", nil, nil)
	if err != nil {
		g.close()
	}
	return err
}
