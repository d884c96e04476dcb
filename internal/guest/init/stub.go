package initproc

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/guest/initproto"
	"github.com/corral-dev/corral/internal/runtime/spare"
	"golang.org/x/sys/unix"
)

// The stub (stub/stub.c, the node's corral-initstub) is PID 1 of a
// hardened non-pooled sandbox: one thread that reaps, answers ping and
// kill, and starts this binary's server ("serve child") for any other
// request. An idle sandbox is then one task instead of a Go runtime's
// threads.

// childMode is the serving stage's second argument as the stub's server.
const childMode = "child"

// gateFd is where a server finds the stub's binary, its gate.
const gateFd = 4

// gateName is argv[0] that makes the stub binary a gate: it waits for a
// byte on fd 3, then execs argv[1] with argv[2:], an exec error going back
// as an errno on fd 4 (stub.c).
const gateName = "corral-gate"

// stubFd is the server's end of its socketpair with the stub: each packet
// from the stub carries one connection whose first packet is still unread.
const stubFd = 3

// The server's one-byte messages to the stub (stub.c's MSG_READY and
// MSG_TOOK): it runs; it received the oldest connection it had not yet
// acknowledged. Until then the stub keeps its copy, and should the server
// die, hands the connection to the next one.
const (
	msgReady = 1
	msgTook  = 2
)

// linger is how long a server with nothing to serve waits for more.
const linger = 2 * time.Second

// numA and numB mark where a packet's numbers go in its encoding (each
// occurs once in it): the stub gets such packets cut around them.
const (
	numA = 987654321
	numB = 123456789
)

// stubArgs are the stub's arguments, in the order stub.c names them: the
// packets it sends and matches, encoded here so that C never parses JSON.
func stubArgs() ([]string, error) {
	pid := os.Getpid()
	v := initproto.Version
	msgs := []any{
		initproto.Reply{Op: initproto.OpReady, Pid: pid},
		initproto.Request{Version: v, Op: initproto.OpPing},
		initproto.Reply{Op: initproto.OpPong, Pid: pid},
		initproto.Request{Version: v, Op: initproto.OpKill, Pgid: numA, Signal: numB},
		initproto.Reply{Op: initproto.OpPong},
		initproto.Reply{Op: initproto.OpError, Class: initproto.ClassResource,
			Error: "init's server did not start: the sandbox is at its PID or memory limit"},
		initproto.Reply{Op: initproto.OpExit, ExitCode: numA},
		initproto.Reply{Op: initproto.OpExit, ExitCode: -1, Signal: numA},
		initproto.Request{Version: v, Op: initproto.OpKill, Signal: numA},
	}
	args := []string{"corral-initstub"}
	for _, m := range msgs {
		b, err := json.Marshal(m)
		if err != nil {
			return nil, err
		}
		for _, num := range []int{numA, numB} {
			head, tail, ok := bytes.Cut(b, []byte(strconv.Itoa(num)))
			if !ok {
				break
			}
			args = append(args, string(head))
			b = tail
		}
		args = append(args, string(b))
	}
	return args, nil
}

// execStub runs the stub behind fd stub in place of the serving stage,
// telling it its own fd (for gates) and corral-init's (exe, for servers);
// the listener and the setup socket are already kept across the exec. The
// fds keep their numbers: any other could be the Go runtime's own.
func execStub(stub, exe int) error {
	args, err := stubArgs()
	if err != nil {
		return err
	}
	for _, fd := range []int{exe, stub} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("keep fd %d across exec: %w", fd, err)
		}
	}
	return execveat(stub, append(args, strconv.Itoa(exe), strconv.Itoa(stub)))
}

// serveChild is the server the stub starts: it serves the connections the
// stub hands over and exits once it has had none for linger.
func serveChild() {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs)
	spare.Threads(spareThreads)
	srv, err := newServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, "corral-init:", err)
		os.Exit(1)
	}
	if err := unix.SetNonblock(stubFd, true); err != nil {
		fmt.Fprintln(os.Stderr, "corral-init: stub socket:", err)
		os.Exit(1)
	}
	sock := os.NewFile(stubFd, "stub")
	srv.stub = stubFd
	unix.CloseOnExec(gateFd)
	srv.gate = gateFd
	// Only now, with its threads made, is the server trusted with
	// connections: the stub answers those of a server that died starting.
	if _, err := unix.Write(stubFd, []byte{msgReady}); err != nil {
		os.Exit(1)
	}
	go srv.reap(sigs)
	if err := srv.serveHanded(sock); err != nil {
		fmt.Fprintln(os.Stderr, "corral-init:", err)
	}
	os.Exit(0)
}

// serveHanded serves each connection the stub hands over on sock, until it
// has served none for linger: it then shuts sock for reading (the stub's
// next hand-over fails and it starts another server), serves what was
// queued before, and returns when all is served.
func (s *server) serveHanded(sock *os.File) error {
	rc, err := sock.SyscallConn()
	if err != nil {
		return fmt.Errorf("stub socket: %w", err)
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		busy     int
		retiring bool
	)
	defer wg.Wait()
	_ = sock.SetReadDeadline(time.Now().Add(linger))
	for {
		fd, err := recvFd(rc)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			mu.Lock()
			_ = sock.SetReadDeadline(time.Time{})
			if busy == 0 && !retiring {
				retiring = true
				if err := unix.Shutdown(stubFd, unix.SHUT_RD); err != nil {
					mu.Unlock()
					return fmt.Errorf("retire: %w", err)
				}
			}
			mu.Unlock()
			continue
		}
		if err == io.EOF {
			return nil // retired and drained, or the stub is gone
		}
		if err != nil {
			return fmt.Errorf("receive from stub: %w", err)
		}
		if err := took(rc); err != nil {
			unix.Close(fd)
			return fmt.Errorf("acknowledge to stub: %w", err)
		}
		c, err := initproto.NewConn(fd, "conn")
		if err != nil {
			continue
		}
		mu.Lock()
		busy++
		_ = sock.SetReadDeadline(time.Time{})
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.handle(c)
			mu.Lock()
			if busy--; busy == 0 && !retiring {
				_ = sock.SetReadDeadline(time.Now().Add(linger))
			}
			mu.Unlock()
		}()
	}
}

// recvFd reads one hand-over packet and returns its fd (close-on-exec).
func recvFd(rc syscall.RawConn) (int, error) {
	var (
		fd   = -1
		rerr error
		buf  [1]byte
		oob  = make([]byte, unix.CmsgSpace(4))
	)
	err := rc.Read(func(s uintptr) bool {
		n, oobn, _, _, e := unix.Recvmsg(int(s), buf[:], oob, unix.MSG_CMSG_CLOEXEC)
		for e == unix.EINTR {
			n, oobn, _, _, e = unix.Recvmsg(int(s), buf[:], oob, unix.MSG_CMSG_CLOEXEC)
		}
		switch {
		case e == unix.EAGAIN:
			return false
		case e != nil:
			rerr = e
		case n == 0:
			rerr = io.EOF
		default:
			fds := initproto.ParseFds(oob[:oobn])
			if len(fds) != 1 {
				closeFds(fds)
				rerr = fmt.Errorf("hand-over with %d fds", len(fds))
			} else {
				fd = fds[0]
			}
		}
		return true
	})
	if err != nil {
		return -1, err
	}
	return fd, rerr
}

// took acknowledges a hand-over, before anything reads the connection: a
// lost acknowledgement would have the stub hand a served connection over
// again, so it waits (in the poller) rather than drop one.
func took(rc syscall.RawConn) error {
	var serr error
	err := rc.Write(func(s uintptr) bool {
		serr = unix.Send(int(s), []byte{msgTook}, unix.MSG_NOSIGNAL)
		for serr == unix.EINTR {
			serr = unix.Send(int(s), []byte{msgTook}, unix.MSG_NOSIGNAL)
		}
		return serr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	return serr
}

// tell tells the stub that pid was started on conn (conn >= 0) or that its
// exit was reported (conn < 0); best effort, and only as the stub's server.
func (s *server) tell(pid int, conn *initproto.Conn) {
	if s.stub < 0 {
		return
	}
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, uint32(pid))
	if conn == nil {
		_ = unix.Sendmsg(s.stub, b, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		return
	}
	_ = conn.Control(func(fd uintptr) {
		_ = unix.Sendmsg(s.stub, b, unix.UnixRights(int(fd)), nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
	})
}
