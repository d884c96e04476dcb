package agentproto

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// A virtio-serial port is one byte stream under every connection the node
// makes to its host end, and the guest learns of a hang-up from a control
// message that can trail the next connection's first bytes: the session
// the guest kept from the last connection may read them, and its stream
// ids collide with the new session's (which ends both). So the node starts
// every connection to a port with a handshake of tokens no yamux frame
// starts with (a frame's first byte is its version, 0): Sync, resent until
// the agent answers Hello, then End. A kept session fails on the first
// Sync and ends; the agent then looks for a Sync, and serves the yamux
// session that starts after the End. Each token carries the connection's
// nonce, so that neither side takes a token of an earlier connection for
// one of this one. Vsock connections need none of it: they are
// connections.
const (
	tokenLen   = 16
	syncMagic  = "\xffcrlSYNC"
	helloMagic = "\xffcrlHELO"
	endMagic   = "\xffcrl-END"
)

// The node sends Sync again after firstResend, then at doubling intervals
// up to maxResend: a kept session swallows the first ones (it fails within
// milliseconds), a booting guest has not opened its port yet.
const (
	firstResend = 10 * time.Millisecond
	maxResend   = 200 * time.Millisecond
)

func token(magic string, nonce []byte) []byte {
	return append([]byte(magic), nonce...)
}

// SyncPort runs the node's side of the handshake on a new connection to a
// port. The returned connection reads on from the agent's Hello: a yamux
// client session goes over it. On failure conn is closed.
func SyncPort(ctx context.Context, conn net.Conn) (net.Conn, error) {
	synced, err := syncPort(ctx, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return synced, nil
}

func syncPort(ctx context.Context, conn net.Conn) (net.Conn, error) {
	nonce := make([]byte, tokenLen-len(syncMagic))
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("port handshake: %w", err)
	}
	sync, hello := token(syncMagic, nonce), token(helloMagic, nonce)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	br := bufio.NewReader(conn)
	var window []byte // the last tokenLen bytes read
	for resend := firstResend; ; resend = min(2*resend, maxResend) {
		if _, err := conn.Write(sync); err != nil {
			return nil, handshakeErr(ctx, err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(resend))
		found, err := scanFor(br, hello, &window)
		if found {
			break
		}
		var ne net.Error
		if ctx.Err() != nil || !errors.As(err, &ne) || !ne.Timeout() {
			return nil, handshakeErr(ctx, err)
		}
	}
	if !stop() {
		return nil, handshakeErr(ctx, ctx.Err())
	}
	_ = conn.SetDeadline(time.Time{})
	if _, err := conn.Write(token(endMagic, nonce)); err != nil {
		return nil, handshakeErr(ctx, err)
	}
	return &bufConn{Conn: conn, r: br}, nil
}

func handshakeErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	return fmt.Errorf("port handshake: %w", err)
}

// scanFor reads until the last len(want) bytes read are want; window
// carries them from one call to the next.
func scanFor(r io.ByteReader, want []byte, window *[]byte) (bool, error) {
	for {
		c, err := r.ReadByte()
		if err != nil {
			return false, err
		}
		*window = append(*window, c)
		if len(*window) > len(want) {
			*window = (*window)[1:]
		}
		if bytes.Equal(*window, want) {
			return true, nil
		}
	}
}

// bufConn is a connection whose reads go through the handshake's buffer.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// AcceptSync runs the agent's side of the handshake on a port: it skips
// what precedes a Sync (what a kept session left, a node that went away
// mid-handshake), answers each new Sync with its Hello and returns after
// the End of the Sync it answered last; r then holds the session's first
// bytes.
func AcceptSync(r *bufio.Reader, w io.Writer) error {
	var window []byte
	for {
		if _, err := scanFor(r, []byte(syncMagic), &window); err != nil {
			return err
		}
		window = window[:0]
		nonce := make([]byte, tokenLen-len(syncMagic))
		if _, err := io.ReadFull(r, nonce); err != nil {
			return err
		}
		if err := answerSyncs(r, w, nonce); err == nil {
			return nil
		} else if !errors.Is(err, errNotToken) {
			return err
		}
	}
}

var errNotToken = errors.New("not a handshake token")

// answerSyncs answers nonce's Sync and reads whole tokens until its End:
// the node's resent Syncs are skipped, a later connection's Sync is
// answered in turn.
func answerSyncs(r io.Reader, w io.Writer, nonce []byte) error {
	tok := make([]byte, tokenLen)
	answered := false
	for {
		if !answered {
			if _, err := w.Write(token(helloMagic, nonce)); err != nil {
				return err
			}
			answered = true
		}
		if _, err := io.ReadFull(r, tok); err != nil {
			return err
		}
		magic, got := string(tok[:len(syncMagic)]), tok[len(syncMagic):]
		switch {
		case magic == endMagic && bytes.Equal(got, nonce):
			return nil
		case magic == syncMagic && !bytes.Equal(got, nonce):
			nonce, answered = append(nonce[:0], got...), false
		case magic == syncMagic: // resent
		default:
			return errNotToken
		}
	}
}
