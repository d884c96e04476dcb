package initproc

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/corral-dev/corral/internal/guest/initproto"
	"github.com/corral-dev/corral/internal/runtime/pidfd"
	"golang.org/x/sys/unix"
)

// server accepts node connections and tracks the processes it started.
type server struct {
	ln   *os.File
	lnrc syscall.RawConn
	null int // /dev/null of the sandbox, stdin of execs without one

	// mu is held while forking and registering a child and while reaping,
	// so that an exit is never seen before its pid is registered.
	mu      sync.Mutex
	waiters map[int]chan exitStatus

	pool *pool // nil unless in pool mode
	// stub is the socket to the stub as its server (see tell), gate the
	// stub's binary that starts its commands (see startGated); else -1.
	stub, gate int
}

// exitStatus is a reaped command's status and resource usage.
type exitStatus struct {
	ws unix.WaitStatus
	ru unix.Rusage
}

func newServer() (*server, error) {
	null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/null: %w", err)
	}
	return &server{null: null, waiters: map[int]chan exitStatus{}, stub: -1, gate: -1}, nil
}

// listen takes the inherited control listener, for serve.
func (s *server) listen() error {
	unix.CloseOnExec(initproto.ListenFd)
	if err := unix.SetNonblock(initproto.ListenFd, true); err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	s.ln = os.NewFile(initproto.ListenFd, "ctl")
	rc, err := s.ln.SyscallConn()
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	s.lnrc = rc
	return nil
}

// serve accepts connections forever; each gets one goroutine.
func (s *server) serve() {
	for {
		var nfd int
		var aerr error
		err := s.lnrc.Read(func(fd uintptr) bool {
			nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
			return aerr != unix.EAGAIN
		})
		if err == nil {
			err = aerr
		}
		if err != nil {
			// EMFILE and friends: nothing to do but keep serving.
			fmt.Fprintln(os.Stderr, "corral-init: accept:", err)
			continue
		}
		c, err := initproto.Adopt(nfd, "conn")
		if err != nil {
			continue
		}
		go s.handle(c)
	}
}

func (s *server) handle(c *initproto.Conn) {
	defer c.Close()
	var req initproto.Request
	fds, err := c.Recv(&req)
	// An exec connection serves on after the exec: see Version 14.
	for err == nil {
		if req.Version != initproto.Version {
			closeFds(fds)
			replyErr(c, initproto.ClassInvalidArgument, fmt.Errorf("%w: got %d, want %d", initproto.ErrVersion, req.Version, initproto.Version))
			return
		}
		switch req.Op {
		case initproto.OpPing:
			closeFds(fds)
			_ = c.Send(initproto.Reply{Op: initproto.OpPong, Pid: os.Getpid()})
		case initproto.OpKill:
			closeFds(fds)
			s.kill(c, req.Pgid, req.Signal)
		case initproto.OpExec:
			if next := s.exec(c, req.Exec, fds); next != nil {
				req, fds, err = next.req, next.fds, next.err
				continue
			}
		case initproto.OpReset, initproto.OpView:
			s.reset(c, req, fds)
			return
		default:
			closeFds(fds)
			replyErr(c, initproto.ClassInvalidArgument, fmt.Errorf("unknown op %q", req.Op))
			return
		}
		req = initproto.Request{}
		fds, err = c.Recv(&req)
	}
	closeFds(fds) // a request that failed to decode may have brought some
}

func (s *server) kill(c *initproto.Conn, pgid, sig int) {
	if pgid <= 1 || sig <= 0 {
		replyErr(c, initproto.ClassInvalidArgument, fmt.Errorf("kill: bad pgid %d or signal %d", pgid, sig))
		return
	}
	if err := unix.Kill(-pgid, unix.Signal(sig)); err != nil && err != unix.ESRCH {
		replyErr(c, initproto.ClassInternal, fmt.Errorf("kill %d: %w", -pgid, err))
		return
	}
	_ = c.Send(initproto.Reply{Op: initproto.OpPong})
}

// exec starts a command, reports its pid, relays kill requests arriving on
// the same connection, and reports the exit. It returns the connection's
// next request if it read it (its relay did), else nil.
func (s *server) exec(c *initproto.Conn, req *initproto.ExecRequest, fds []int) *request {
	defer func() { closeFds(fds) }() // fds is set to nil once handed over
	if req == nil || len(fds) < 2 || req.Stdin && len(fds) < 3 {
		replyErr(c, initproto.ClassInvalidArgument, errors.New("exec: missing spec or fds"))
		return nil
	}
	if req.ThenReset && s.pool == nil {
		replyErr(c, initproto.ClassInvalidArgument, errors.New("exec: then_reset: init is not in pool mode"))
		return nil
	}
	stdin := s.null
	if req.Stdin {
		stdin = fds[2]
	}
	// The stub learns of the command at once: a command may kill the
	// server (it is not PID 1), and the stub then reports the exit.
	pid, pidfd, done, err := s.startIn(req, [3]int{stdin, fds[0], fds[1]}, func(pid int) { s.tell(pid, c) })
	if err != nil {
		replyErr(c, classify(err), err)
		return nil
	}
	closeFds(fds) // the child has its copies; the node must see EOF
	fds = nil
	if !req.NoStarted {
		_ = c.Send(initproto.Reply{Op: initproto.OpStarted, Pid: pid})
	}
	relayed := make(chan request, 1)
	go s.relayKills(c, pid, relayed)
	es := s.awaitExit(pidfd, done)
	ws := es.ws
	r := initproto.Reply{Op: initproto.OpExit, ExitCode: ws.ExitStatus(),
		CPUNanos: es.ru.Utime.Nano() + es.ru.Stime.Nano()}
	if ws.Signaled() {
		r.ExitCode, r.Signal = -1, int(ws.Signal())
	}
	if req.ThenReset {
		// Done while init is awake for the exit anyway (the node's own
		// reset request would wake it once more), and before the exit
		// reply: when the node has it, nothing of the command runs.
		var err error
		if r.Dirty, err = s.pool.reset(req.ResetKeep); err != nil {
			r.ResetError = err.Error()
		}
	}
	err = c.Send(r)
	s.tell(pid, nil) // reported (or the node is gone): the stub need not
	if err != nil {
		// The node gave up on the exec (cancelled) or the reply was lost:
		// worth a line in init.log, which only the node can read.
		fmt.Fprintf(os.Stderr, "corral-init: exec %d: send exit: %v\n", pid, err)
		return &request{err: err} // the relay ends when the caller closes c
	}
	next := <-relayed
	return &next
}

// request is a request read from a connection, or why none could be.
type request struct {
	req initproto.Request
	fds []int
	err error
}

// relayKills signals the exec's process group for every kill request on its
// connection, until the connection closes or another request comes, which
// it hands to relayed (with the error that ended the connection, if so).
// Requests are served in the order sent: a kill sent before the next exec
// never reaches that exec's processes.
func (s *server) relayKills(c *initproto.Conn, pgid int, relayed chan<- request) {
	for {
		var req initproto.Request
		fds, err := c.Recv(&req)
		if err != nil || req.Op != initproto.OpKill {
			relayed <- request{req: req, fds: fds, err: err}
			return // closed by either side, or the next request
		}
		closeFds(fds)
		if req.Signal > 0 {
			_ = unix.Kill(-pgid, unix.Signal(req.Signal))
		}
	}
}

// reap waits for every child (PID 1 inherits all orphans) on SIGCHLD and
// hands registered exits to their exec.
func (s *server) reap(sigs <-chan os.Signal) {
	for sig := range sigs {
		if sig != unix.SIGCHLD {
			continue // caught so that PID 1 never dies of it
		}
		s.reapExited()
	}
}

// reapExited reaps every exited child and hands registered exits to their
// exec.
func (s *server) reapExited() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		var ws unix.WaitStatus
		var ru unix.Rusage
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, &ru)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if ch, ok := s.waiters[pid]; ok {
			delete(s.waiters, pid)
			ch <- exitStatus{ws, ru}
		}
	}
}

// awaitExit waits for a started command's exit (pidfd is closed here, -1
// if there is none). The pidfd wakes this goroutine through the netpoller
// once the command has exited, and it reaps at once: one thread woken,
// where SIGCHLD takes a thread for the signal, another for Go's signal
// goroutine, and then the reaper. The reaper stays: it takes orphans, and
// whichever reaps first hands the exit over.
func (s *server) awaitExit(pidfd int, done chan exitStatus) exitStatus {
	if pidfd >= 0 {
		if waitReadable(pidfd) == nil {
			s.reapExited()
		}
	}
	return <-done
}

// waitReadable waits until fd (a pidfd, closed here) polls readable.
func waitReadable(fd int) error {
	// A pidfd has no other status flag to keep.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		unix.Close(fd)
		return err
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Read(func(fd uintptr) bool { return pidfd.Exited(int(fd)) })
}

// startIn starts a command; in pool mode on the forker thread, inside the
// view, and never concurrently with a reset.
func (s *server) startIn(req *initproto.ExecRequest, stdio [3]int, forked func(pid int)) (pid, pidfd int, done chan exitStatus, err error) {
	if s.pool == nil {
		return s.start(req, stdio, forked)
	}
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	if s.pool.forker == nil {
		return 0, -1, nil, &reqError{initproto.ClassInternal, errors.New("exec: the sandbox is between views (being recycled)")}
	}
	// A fncall's pids start at the same number whatever earlier calls
	// forked; a recyclable container's count up as on any Linux box (its
	// resets rewind them).
	if !s.pool.cfg.View {
		if err := s.pool.rewindPids(callPidBase); err != nil {
			return 0, -1, nil, err
		}
	}
	s.pool.forker.run(func() { pid, pidfd, done, err = s.start(req, stdio, forked) })
	return pid, pidfd, done, err
}

// reset serves OpReset and OpView (pool mode only), and every further such
// request on the same connection: the node keeps one open for all its
// resets.
func (s *server) reset(c *initproto.Conn, req initproto.Request, fds []int) {
	if s.pool == nil {
		closeFds(fds)
		replyErr(c, initproto.ClassInvalidArgument, errors.New("reset: init is not in pool mode"))
		return
	}
	for {
		var rep initproto.Reply
		var err error
		switch {
		case req.Op == initproto.OpReset:
			closeFds(fds)
			rep.Dirty, err = s.pool.reset(req.Keep)
		case req.Op == initproto.OpView && len(fds) == 1:
			err = s.pool.attach(fds[0])
		default:
			closeFds(fds)
			err = fmt.Errorf("%s: unexpected on a reset connection (with %d fds)", req.Op, len(fds))
		}
		if err != nil {
			replyErr(c, initproto.ClassInternal, err)
			return
		}
		rep.Op = initproto.OpPong
		if c.Send(rep) != nil {
			return
		}
		req = initproto.Request{}
		if fds, err = c.Recv(&req); err != nil {
			closeFds(fds)
			return
		}
		if req.Version != initproto.Version {
			closeFds(fds)
			return
		}
	}
}

func replyErr(c *initproto.Conn, class string, err error) {
	_ = c.Send(initproto.Reply{Op: initproto.OpError, Class: class, Error: err.Error()})
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
