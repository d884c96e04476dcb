package agentproto

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// portPair is a connected pair of stream sockets: the node's end and the
// guest's end of a port (buffered, unlike net.Pipe, as a port is).
func portPair(t *testing.T) (node, guest net.Conn) {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "port"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	node, err = net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	guest = <-accepted
	t.Cleanup(func() { node.Close(); guest.Close() })
	return node, guest
}

// handshake runs SyncPort on node, after earlier (what an earlier
// connection left in the stream), while the guest first runs kept (a
// session it kept) and then AcceptSync; it checks that the bytes after
// the handshake reach each side whole, in both directions.
func handshake(t *testing.T, earlier []byte, kept func(guest net.Conn, r *bufio.Reader)) {
	t.Helper()
	node, guest := portPair(t)
	if _, err := node.Write(earlier); err != nil {
		t.Fatal(err)
	}
	guestDone := make(chan error, 1)
	go func() {
		r := bufio.NewReader(guest)
		if kept != nil {
			kept(guest, r)
		}
		if err := AcceptSync(r, guest); err != nil {
			guestDone <- err
			return
		}
		got := make([]byte, 5)
		if _, err := io.ReadFull(r, got); err != nil || string(got) != "first" {
			guestDone <- errors.New("guest read " + string(got))
			return
		}
		_, err := guest.Write([]byte("reply"))
		guestDone <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := SyncPort(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("first")); err != nil {
		t.Fatal(err)
	}
	if err := <-guestDone; err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(conn, got); err != nil || string(got) != "reply" {
		t.Fatalf("node read %q %v", got, err)
	}
}

func TestPortSync(t *testing.T) {
	t.Run("clean", func(t *testing.T) { handshake(t, nil, nil) })
	// A session the guest kept reads the first Sync (and fails on it) and
	// had written its own frames, a Hello of another nonce among them: the
	// node waits for its Hello, resending Sync.
	t.Run("kept session", func(t *testing.T) {
		handshake(t, nil, func(guest net.Conn, r *bufio.Reader) {
			_, _ = io.ReadFull(r, make([]byte, tokenLen))
			_, _ = guest.Write(append([]byte("\x00\x01stale frames"), token(helloMagic, []byte("12345678"))...))
		})
	})
	// A node that went away after its Sync: the guest answers it, then the
	// next connection's Sync.
	t.Run("abandoned handshake", func(t *testing.T) {
		handshake(t, token(syncMagic, []byte("abcdefgh")), nil)
	})
}

// TestPortSyncGivesUp: without an agent answering, the handshake ends
// with the caller's context.
func TestPortSyncGivesUp(t *testing.T) {
	node, _ := portPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := SyncPort(ctx, node)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("handshake with no agent: %v, want the deadline", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("gave up after %v", d)
	}
}

// TestKeptSessionFailsOnSync: a session the guest kept from an earlier
// connection ends on the next connection's first Sync (a yamux frame
// starts with its version, 0; a token never does).
func TestKeptSessionFailsOnSync(t *testing.T) {
	node, guest := portPair(t)
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	sess, err := yamux.Server(guest, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.Write(token(syncMagic, []byte("abcdefgh"))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sess.CloseChan():
	case <-time.After(5 * time.Second):
		t.Fatal("a yamux session read a Sync token and went on")
	}
}
