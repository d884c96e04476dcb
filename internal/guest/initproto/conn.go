package initproto

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// MaxMessage bounds one packet (a big environment still fits).
const MaxMessage = 1 << 20

// maxFds bounds the descriptors accepted with one message.
const maxFds = 64

// Conn is one SOCK_SEQPACKET connection driven through the Go poller.
type Conn struct {
	f  *os.File
	rc syscall.RawConn
}

// NewConn takes ownership of a connected SOCK_SEQPACKET fd; it is made
// non-blocking and close-on-exec.
func NewConn(fd int, name string) (*Conn, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	unix.CloseOnExec(fd)
	return Adopt(fd, name)
}

// Adopt takes ownership of a connected SOCK_SEQPACKET fd that is already
// non-blocking and close-on-exec (from accept4 or socket with both flags):
// NewConn without its two system calls.
func Adopt(fd int, name string) (*Conn, error) {
	f := os.NewFile(uintptr(fd), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Conn{f: f, rc: rc}, nil
}

// Dial connects to init's control socket.
func Dial(path string) (*Conn, error) {
	addr := &unix.SockaddrUnix{Name: path}
	// Non-blocking from the start (NewConn would make it so in three more
	// syscalls, on every exec): a unix socket connects at once, or fails
	// with EAGAIN while init's backlog is full, and then a blocking
	// connect waits for room as before.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if err = unix.Connect(fd, addr); err == nil {
		return Adopt(fd, path)
	}
	unix.Close(fd)
	if err != unix.EAGAIN {
		return nil, err
	}
	if fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0); err != nil {
		return nil, err
	}
	if err := unix.Connect(fd, addr); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return NewConn(fd, path)
}

// Control runs fn with the connection's fd (see syscall.RawConn).
func (c *Conn) Control(fn func(fd uintptr)) error { return c.rc.Control(fn) }

// Close closes the connection.
func (c *Conn) Close() error { return c.f.Close() }

// SetDeadline bounds pending and future Send/Recv calls.
func (c *Conn) SetDeadline(t time.Time) error { return c.f.SetDeadline(t) }

// Send writes one message with optional fds.
func (c *Conn) Send(msg any, fds ...int) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	var serr error
	err = c.rc.Write(func(fd uintptr) bool {
		serr = ignoringEINTR(func() error { return unix.Sendmsg(int(fd), b, oob, nil, unix.MSG_NOSIGNAL) })
		return serr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	return serr
}

// Recv reads one message into msg and returns the fds that came with it
// (close-on-exec; the caller owns them). It returns io.EOF when the peer
// closed the connection.
func (c *Conn) Recv(msg any) ([]int, error) {
	var (
		n, oobn int
		rerr    error
		buf     []byte
		oob     = make([]byte, unix.CmsgSpace(maxFds*4))
	)
	err := c.rc.Read(func(fd uintptr) bool {
		// Peek at the size first so that small messages need no big buffer.
		n, rerr = peekLen(int(fd))
		if rerr == unix.EAGAIN {
			return false
		}
		if rerr != nil || n == 0 {
			return true
		}
		if n > MaxMessage {
			rerr = fmt.Errorf("message of %d bytes exceeds %d", n, MaxMessage)
			return true
		}
		buf = make([]byte, n)
		rerr = ignoringEINTR(func() (err error) {
			n, oobn, _, _, err = recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
			return err
		})
		return rerr != unix.EAGAIN
	})
	if err == nil {
		err = rerr
	}
	fds := ParseFds(oob[:oobn])
	if err != nil {
		closeAll(fds)
		return nil, err
	}
	if n == 0 {
		closeAll(fds)
		return nil, io.EOF
	}
	if err := json.Unmarshal(buf[:n], msg); err != nil {
		closeAll(fds)
		return nil, fmt.Errorf("decode message: %w", err)
	}
	return fds, nil
}

// recvmsg is unix.Recvmsg; a test stands in for the kernel's answer to a
// race it cannot provoke on demand.
var recvmsg = unix.Recvmsg

// peekLen returns the size of the next message without reading it, 0 once
// the peer has closed. A non-blocking SOCK_SEQPACKET read looks at its
// queue first and at the peer's shutdown after (the kernel's
// unix_dgram_recvmsg): a last message sent just before the peer closed,
// landing between the two looks, reads as end of file although it is
// queued, as about one exec in 150,000 did (its exit report was lost). Once
// the shutdown is seen no message can follow, so a second look settles it.
func peekLen(fd int) (int, error) {
	peek := func() (n int, err error) {
		err = ignoringEINTR(func() (err error) {
			n, _, _, _, err = recvmsg(fd, nil, nil, unix.MSG_PEEK|unix.MSG_TRUNC)
			return err
		})
		return n, err
	}
	n, err := peek()
	if err == nil && n == 0 {
		n, err = peek()
	}
	return n, err
}

// ignoringEINTR repeats a socket call that a signal interrupted: init
// catches every signal (SIGCHLD comes with each exit), and a message lost to
// EINTR would surface as a dropped exec.
func ignoringEINTR(call func() error) error {
	for {
		if err := call(); err != unix.EINTR {
			return err
		}
	}
}

// ParseFds returns the fds of SCM_RIGHTS messages in oob.
func ParseFds(oob []byte) []int {
	if len(oob) == 0 {
		return nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if r, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, r...)
		}
	}
	return fds
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// ErrVersion is returned for a request of another protocol version.
var ErrVersion = errors.New("protocol version mismatch")
