package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/initproto"
)

// Client talks to one init over its control socket; every call is one
// connection, so a restarted daemon simply dials again. A Client made by
// NewClient keeps one connection dialed ahead for the next exec (dialed
// while the previous one runs), so that an exec does not wait for a connect
// and init's accept; Close drops it. After ReuseConns, an exec's connection
// is kept for the next one instead.
type Client struct {
	Path  string
	spare *spareConn // nil: every exec dials
}

// spareConn is the connection a Client keeps for its next exec.
type spareConn struct {
	mu     sync.Mutex
	conn   *initproto.Conn
	closed bool
	reuse  bool // see ReuseConns
}

// NewClient returns a Client of init's socket at path that keeps a
// connection ready for execs.
func NewClient(path string) Client { return Client{Path: path, spare: &spareConn{}} }

// ReuseConns makes the Client keep each exec's connection, once the exec
// has ended, for the next exec (init protocol 14) rather than dial one
// ahead: no connect and no accept per exec. Only for an init whose server
// lives as long as the sandbox (corral-init as PID 1): a stub's server
// lingers and goes, and a connection it held would fail the exec sent on
// it.
func (c Client) ReuseConns() {
	if c.spare == nil {
		return
	}
	c.spare.mu.Lock()
	defer c.spare.mu.Unlock()
	c.spare.reuse = true
}

// ReusesConns reports whether ReuseConns was called.
func (c Client) ReusesConns() bool {
	if c.spare == nil {
		return false
	}
	c.spare.mu.Lock()
	defer c.spare.mu.Unlock()
	return c.spare.reuse
}

// put keeps conn, an ended exec's, for the next exec if the Client reuses
// connections and keeps none; it reports whether it did.
func (c Client) put(conn *initproto.Conn) bool {
	sp := c.spare
	if sp == nil {
		return false
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.reuse || sp.closed || sp.conn != nil {
		return false
	}
	sp.conn = conn
	return true
}

// take returns the kept connection (kept true), or dials one.
func (c Client) take() (conn *initproto.Conn, kept bool, err error) {
	if c.spare != nil {
		c.spare.mu.Lock()
		conn, c.spare.conn = c.spare.conn, nil
		c.spare.mu.Unlock()
		if conn != nil {
			return conn, true, nil
		}
	}
	conn, err = initproto.Dial(c.Path)
	return conn, false, err
}

// refill dials the connection the next exec takes, unless one is kept, the
// Client is closed or reuses connections. Failures are left to that exec's
// own dial.
func (c Client) refill() {
	sp := c.spare
	if sp == nil {
		return
	}
	sp.mu.Lock()
	busy := sp.conn != nil || sp.closed || sp.reuse
	sp.mu.Unlock()
	if busy {
		return
	}
	conn, err := initproto.Dial(c.Path)
	if err != nil {
		return
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.conn != nil || sp.closed {
		conn.Close()
		return
	}
	sp.conn = conn
}

// Close drops the kept connection; later execs dial their own.
func (c Client) Close() {
	if c.spare == nil {
		return
	}
	c.spare.mu.Lock()
	defer c.spare.mu.Unlock()
	c.spare.closed = true
	if c.spare.conn != nil {
		c.spare.conn.Close()
		c.spare.conn = nil
	}
}

func (c Client) dial(ctx context.Context) (*initproto.Conn, func(), error) {
	conn, err := initproto.Dial(c.Path)
	if err != nil {
		return nil, nil, errdefs.Unavailable("connect to init: %v", err)
	}
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	return conn, func() { stop(); conn.Close() }, nil
}

func (c Client) call(ctx context.Context, req initproto.Request) (initproto.Reply, error) {
	conn, done, err := c.dial(ctx)
	if err != nil {
		return initproto.Reply{}, err
	}
	defer done()
	req.Version = initproto.Version
	var r initproto.Reply
	if err := conn.Send(req); err != nil {
		return r, ctxOr(ctx, err)
	}
	if _, err := conn.Recv(&r); err != nil {
		return r, ctxOr(ctx, err)
	}
	return r, ReplyError(r)
}

// Ping checks that init answers and returns its pid inside the sandbox.
func (c Client) Ping(ctx context.Context) error {
	_, err := c.call(ctx, initproto.Request{Op: initproto.OpPing})
	return err
}

// Kill signals a process group inside the sandbox.
func (c Client) Kill(ctx context.Context, pgid, sig int) error {
	_, err := c.call(ctx, initproto.Request{Op: initproto.OpKill, Pgid: pgid, Signal: sig})
	return err
}

// Resetter resets a pooled sandbox over one connection kept open for all
// its resets (init serves any number of resets on it). Not safe for
// concurrent use.
type Resetter struct {
	Client Client
	conn   *initproto.Conn
}

// Reset kills every process of the sandbox but init and keep, and restores
// its view; it reports whether the view had been written to (then keep was
// killed too). A failed reset drops the
// connection (the caller should not reuse the sandbox anyway).
func (r *Resetter) Reset(ctx context.Context, keep []int) (dirty bool, err error) {
	rep, err := r.roundTrip(ctx, initproto.Request{Op: initproto.OpReset, Keep: keep})
	return rep.Dirty, err
}

// Renew hands init the fresh view of a sandbox whose views the node makes
// (initproto.Config.View), after a reset reported the last one dirty (init
// detached it, and refuses a view otherwise). The caller keeps view and
// closes it after the call.
func (r *Resetter) Renew(ctx context.Context, view *os.File) error {
	_, err := r.roundTrip(ctx, initproto.Request{Op: initproto.OpView}, int(view.Fd()))
	return err
}

// roundTrip sends req (with fds) on the reset connection, dialed if there
// is none, and reads init's reply, under ctx's deadline (a minute without
// one); a failure drops the connection.
func (r *Resetter) roundTrip(ctx context.Context, req initproto.Request, fds ...int) (initproto.Reply, error) {
	if r.conn == nil {
		conn, err := initproto.Dial(r.Client.Path)
		if err != nil {
			return initproto.Reply{}, errdefs.Unavailable("connect to init: %v", err)
		}
		r.conn = conn
	}
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Now().Add(time.Minute)
	}
	r.conn.SetDeadline(d)
	req.Version = initproto.Version
	var rep initproto.Reply
	err := r.conn.Send(req, fds...)
	if err == nil {
		_, err = r.conn.Recv(&rep)
	}
	if err == nil {
		err = ReplyError(rep)
	}
	if err != nil {
		r.Close()
		return rep, ctxOr(ctx, err)
	}
	return rep, nil
}

// Close drops the connection.
func (r *Resetter) Close() {
	if r.conn != nil {
		r.conn.Close()
		r.conn = nil
	}
}

// Exec is a started command.
type Exec struct {
	Pid       int // also its process group, as init sees it; 0 with ExecRequest.NoStarted
	conn      *initproto.Conn
	exit      chan ExitResult
	client    Client
	thenReset bool
	noStarted bool

	mu sync.Mutex
	// ended: init has sent the exec's last reply, so the connection may
	// serve the next exec; closed: Close was called, no Signal after it.
	ended, closed bool
}

// ExitResult is how the command's main process ended.
type ExitResult struct {
	Code, Signal int
	CPU          time.Duration // user+system time, from wait4
	Err          error         // the connection failed before an exit was reported
	// NotStarted is why the command could not start, an errdefs class
	// (ExecRequest.NoStarted only: else Client.Exec returns it).
	NotStarted error
	// Reset is the outcome of the reset ExecRequest.ThenReset asked for,
	// done before the exit was reported (nil: none was asked for or done).
	Reset *ResetOutcome
}

// ResetOutcome is the result of a reset init did after a command.
type ResetOutcome struct {
	Dirty bool  // the view had been written to (see Resetter.Reset)
	Err   error // the reset failed: the sandbox must not be reused
}

// Exec starts a command with the given stdio fds: stdout, stderr and stdin
// (-1 for none). The caller closes its copies of the fds after the call and
// must Close the Exec.
func (c Client) Exec(ctx context.Context, req initproto.ExecRequest, stdio [3]int) (*Exec, error) {
	conn, kept, err := c.take()
	if err != nil {
		return nil, errdefs.Unavailable("connect to init: %v", err)
	}
	fds := stdio[:2]
	if stdio[2] >= 0 {
		req.Stdin = true
		fds = stdio[:]
	}
	msg := initproto.Request{Version: initproto.Version, Op: initproto.OpExec, Exec: &req}
	stop, err := sendCancellable(ctx, conn, msg, fds)
	if err != nil && kept && ctx.Err() == nil {
		// Init no longer serves the kept connection: dial as before.
		stop()
		conn.Close()
		if conn, err = initproto.Dial(c.Path); err != nil {
			return nil, errdefs.Unavailable("connect to init: %v", err)
		}
		stop, err = sendCancellable(ctx, conn, msg, fds)
	}
	var r initproto.Reply
	if err == nil && !req.NoStarted {
		_, err = conn.Recv(&r)
	}
	if err == nil {
		err = ReplyError(r)
	}
	stop()
	if err != nil {
		conn.Close()
		return nil, ctxOr(ctx, err)
	}
	// Started (or, with NoStarted, sent): ctx no longer bounds the
	// connection; the caller kills on it. The deadline is cleared after
	// stop, so that ctx ending in between cannot leave one behind.
	conn.SetDeadline(time.Time{})
	e := &Exec{Pid: r.Pid, conn: conn, exit: make(chan ExitResult, 1), client: c, thenReset: req.ThenReset, noStarted: req.NoStarted}
	if req.NoStarted {
		// The first reply is the exit, or why the command did not start.
		go e.wait()
		return e, nil
	}
	if r.Op == initproto.OpExit {
		// The command killed init's server before it said started; init
		// (the stub) reported the exit instead.
		e.exit <- exitOf(r, nil)
		return e, nil
	}
	go e.wait()
	return e, nil
}

func exitOf(r initproto.Reply, err error) ExitResult {
	return ExitResult{Code: r.ExitCode, Signal: r.Signal, CPU: time.Duration(r.CPUNanos), Err: err}
}

// sendCancellable sends msg with a deadline of now once ctx ends; stop ends
// that.
func sendCancellable(ctx context.Context, conn *initproto.Conn, msg initproto.Request, fds []int) (stop func() bool, err error) {
	stop = context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	return stop, conn.Send(msg, fds...)
}

func (e *Exec) wait() {
	// While the command runs: the next exec's connection.
	e.client.refill()
	var r initproto.Reply
	_, err := e.conn.Recv(&r)
	if err == nil && e.noStarted && r.Op == initproto.OpError {
		e.end()
		e.exit <- ExitResult{NotStarted: ReplyError(r)}
		return
	}
	if err == nil && r.Op != initproto.OpExit {
		err = fmt.Errorf("unexpected reply %q", r.Op)
	}
	if err == nil {
		e.end()
	}
	x := exitOf(r, err)
	if e.thenReset && err == nil {
		x.Reset = &ResetOutcome{Dirty: r.Dirty}
		if r.ResetError != "" {
			x.Reset.Err = fmt.Errorf("reset after the command: %s", r.ResetError)
		}
	}
	e.exit <- x
}

// Exited delivers the exit once.
func (e *Exec) Exited() <-chan ExitResult { return e.exit }

func (e *Exec) end() {
	e.mu.Lock()
	e.ended = true
	e.mu.Unlock()
}

// Signal signals the command's process group. After Close it fails: the
// connection may serve another exec by then.
func (e *Exec) Signal(sig int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errors.New("signal: the exec is closed")
	}
	return e.conn.Send(initproto.Request{Version: initproto.Version, Op: initproto.OpKill, Signal: sig})
}

// Close drops the connection, or keeps it for the next exec if the exec
// has ended and the Client reuses connections; a command still running
// keeps running.
func (e *Exec) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	if e.ended && e.client.put(e.conn) {
		return nil
	}
	return e.conn.Close()
}

// ReplyError maps an init error reply to an errdefs class.
func ReplyError(r initproto.Reply) error {
	if r.Op != initproto.OpError {
		return nil
	}
	switch r.Class {
	case initproto.ClassNotFound:
		return errdefs.NotFound("%s", r.Error)
	case initproto.ClassInvalidArgument:
		return errdefs.InvalidArgument("%s", r.Error)
	case initproto.ClassPermissionDenied:
		return errdefs.PermissionDenied("%s", r.Error)
	case initproto.ClassResource:
		return errdefs.ResourceExhausted("%s", r.Error)
	}
	return errors.New(r.Error)
}

func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
