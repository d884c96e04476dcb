package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// channel hands out one byte stream per yamux session: the same
// virtio-serial port again and again (the node reconnecting after a
// restart or a snapshot), or the next vsock connection.
type channel interface {
	next() (io.ReadWriteCloser, error)
}

func openChannel(fc *agentproto.FileConfig) (channel, error) {
	if fc.Port == "" {
		return listenVsock(fc.VsockPort)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ents, _ := os.ReadDir("/sys/class/virtio-ports")
		for _, e := range ents {
			name, err := os.ReadFile(filepath.Join("/sys/class/virtio-ports", e.Name(), "name"))
			if err == nil && strings.TrimSpace(string(name)) == fc.Port {
				// The kernel allows one opener per port: holding it open
				// keeps every guest process from impersonating the agent.
				f, err := os.OpenFile("/dev/"+e.Name(), os.O_RDWR|unix.O_NONBLOCK, 0)
				if err != nil {
					return nil, fmt.Errorf("open port %s: %w", fc.Port, err)
				}
				return &serialPort{f: f}, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no virtio-serial port %q", fc.Port)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serialPort is a virtio-serial port. Every connection of the node to its
// host end starts with the port handshake (agentproto.AcceptSync); next
// waits for the next one.
type serialPort struct{ f *os.File }

func (p *serialPort) next() (io.ReadWriteCloser, error) {
	for {
		c := &sessionConn{f: p.f}
		c.r = bufio.NewReader(portReader{c})
		err := agentproto.AcceptSync(c.r, c)
		if err == nil {
			return c, nil
		}
		// A failed write of the Hello (the node hung up) must not end the
		// agent: the next connection handshakes again. The pause keeps a
		// port that keeps failing from flooding the console.
		logf("port handshake: %v", err)
		c.Close()
		time.Sleep(time.Second)
	}
}

// hungUpPause is how often a read retries while the node's end is not
// connected.
const hungUpPause = 20 * time.Millisecond

// sessionConn lends the port to one yamux session. A hang-up of the
// node's end does not end it: the guest learns of one late (see
// agentproto.SyncPort), so the session goes on until it fails on the next
// connection's handshake, or detaches. Close ends the session's pending
// read without closing the port, so that it reads no more of the stream.
type sessionConn struct {
	f      *os.File
	r      *bufio.Reader
	rmu    sync.Mutex
	closed atomic.Bool
}

func (c *sessionConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// portReader reads the port for a sessionConn's buffer.
type portReader struct{ c *sessionConn }

func (pr portReader) Read(p []byte) (int, error) {
	c := pr.c
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		if c.closed.Load() {
			return 0, io.EOF
		}
		n, err := c.f.Read(p)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			return n, io.EOF
		case n == 0 && err == io.EOF: // the node's end is not connected
			time.Sleep(hungUpPause)
		default:
			return n, err
		}
	}
}

func (c *sessionConn) Write(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, io.ErrClosedPipe
	}
	return c.f.Write(p)
}

func (c *sessionConn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	_ = c.f.SetReadDeadline(time.Now())
	c.rmu.Lock() // the pending read has returned
	defer c.rmu.Unlock()
	return c.f.SetReadDeadline(time.Time{})
}

// vsockListener accepts the node's connections on a vsock port (through
// Firecracker's hybrid vsock, a unix socket on the node).
type vsockListener struct{ fd int }

func listenVsock(port uint32) (channel, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("vsock socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock bind %d: %w", port, err)
	}
	if err := unix.Listen(fd, 4); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock listen: %w", err)
	}
	return &vsockListener{fd: fd}, nil
}

func (l *vsockListener) next() (io.ReadWriteCloser, error) {
	for {
		nfd, _, err := unix.Accept4(l.fd, unix.SOCK_CLOEXEC)
		if err == unix.EINTR || err == unix.ECONNABORTED {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("vsock accept: %w", err)
		}
		return os.NewFile(uintptr(nfd), "vsock"), nil
	}
}
