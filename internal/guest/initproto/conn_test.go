package initproto

import (
	"testing"

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
