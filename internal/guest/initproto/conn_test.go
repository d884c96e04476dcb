package initproto

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRecvLastMessageBeforeClose: the peer sends its last message and
// closes between the kernel's look at the queue and its look at the
// shutdown, so the read says end of file with the message queued (see
// peekLen). The window is a few instructions wide and cannot be hit on
// demand, so the test gives the kernel's answer itself at that moment:
// the real peek finds the queue empty, then the peer sends and closes on
// the real socket, then the peek reports end of file. Recv must still
// return the message.
func TestRecvLastMessageBeforeClose(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewConn(fds[0], "a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewConn(fds[1], "b")
	if err != nil {
		t.Fatal(err)
	}
	raced := false
	recvmsg = func(fd int, p, oob []byte, flags int) (int, int, int, unix.Sockaddr, error) {
		n, oobn, rf, from, err := unix.Recvmsg(fd, p, oob, flags)
		if raced || flags&unix.MSG_PEEK == 0 {
			return n, oobn, rf, from, err
		}
		raced = true
		if err != unix.EAGAIN {
			t.Errorf("first peek: got %d bytes, %v; want an empty queue", n, err)
		}
		if err := b.Send(Reply{Op: OpExit, ExitCode: 7}); err != nil {
			t.Errorf("peer send: %v", err)
		}
		b.Close()
		return 0, 0, 0, nil, nil
	}
	defer func() { recvmsg = unix.Recvmsg }()

	var r Reply
	if _, err := a.Recv(&r); err != nil {
		t.Fatalf("Recv: %v; want the exit sent before the close", err)
	}
	if !raced || r.Op != OpExit || r.ExitCode != 7 {
		t.Fatalf("Recv: got %+v (race staged: %v), want exit 7", r, raced)
	}
	if _, err := a.Recv(&r); err == nil {
		t.Fatal("Recv after the last message: no error, want end of file")
	}
}

// TestDialWaitsForBacklog: Dial's non-blocking connect fails with EAGAIN
// while the listener's backlog is full; Dial then waits for room, as a
// blocking connect does, and the connection it returns carries messages.
func TestDialWaitsForBacklog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ctl")
	ln, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ln)
	if err := unix.Bind(ln, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(ln, 0); err != nil { // room for one pending connection
		t.Fatal(err)
	}
	first, err := Dial(path)
	if err != nil {
		t.Fatalf("first Dial: %v", err)
	}
	defer first.Close()
	type dialed struct {
		c   *Conn
		err error
	}
	second := make(chan dialed, 1)
	go func() {
		c, err := Dial(path)
		second <- dialed{c, err}
	}()
	select {
	case d := <-second:
		t.Fatalf("second Dial returned (%v) with the backlog full; want it to wait", d.err)
	case <-time.After(200 * time.Millisecond):
	}
	var accepted []int
	for range 2 {
		fd, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		accepted = append(accepted, fd)
	}
	d := <-second
	if d.err != nil {
		t.Fatalf("second Dial after the backlog drained: %v", d.err)
	}
	defer d.c.Close()
	if err := d.c.Send(Request{Version: Version, Op: OpPing}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	n, err := unix.Read(accepted[1], buf)
	if err != nil || !strings.Contains(string(buf[:n]), OpPing) {
		t.Fatalf("the listener read %q %v; want the ping", buf[:n], err)
	}
}
