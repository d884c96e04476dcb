package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// h1Transport is the HTTP/1.1 RoundTripper of plain (unix socket or
// http://) addresses. The calling goroutine writes the request and reads
// the response itself. net/http's Transport hands every request to a
// writer goroutine and every response back from a reader goroutine; when
// the client is otherwise idle, as it is while it waits for an exec, each
// hand-off wakes a parked thread, and a call costs about 0.1 ms more on a
// small VM (docs/lifecycle.md, "One exec traced end to end").
//
// Connections are kept for reuse until maxIdle; at most cap(slots) are
// open at once and a call beyond that waits for one. Only what Connect
// sends over HTTP/1.1 passes here (unary and server-streaming calls, whose
// request body is written before the response is read); bidirectional
// streams need HTTP/2 and use net/http's Transport.
type h1Transport struct {
	dial    func(ctx context.Context) (net.Conn, error)
	idle    chan *h1Conn  // connections between calls, the oldest first
	slots   chan struct{} // one token per open connection
	maxIdle time.Duration // how long an unused connection is kept

	mu       sync.Mutex
	sweeping bool // a sweep of the kept connections is scheduled
}

// h1MaxIdle is how long an unused connection is kept: as long as
// net/http's default, so that a client left alone lets go of the server.
const h1MaxIdle = 90 * time.Second

func newH1Transport(maxConns int, dial func(ctx context.Context) (net.Conn, error)) *h1Transport {
	return &h1Transport{dial: dial, idle: make(chan *h1Conn, maxConns), slots: make(chan struct{}, maxConns), maxIdle: h1MaxIdle}
}

type h1Conn struct {
	net.Conn
	br        *bufio.Reader
	bw        *bufio.Writer
	idleSince time.Time
}

func (t *h1Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if req.URL.Scheme != "http" {
		closeRequestBody(req)
		return nil, fmt.Errorf("corral client: scheme %q on a plain HTTP/1.1 connection", req.URL.Scheme)
	}
	for retried := false; ; retried = true {
		c, reused, err := t.get(ctx)
		if err != nil {
			closeRequestBody(req)
			return nil, err
		}
		// Cancelling ctx closes the connection, as with net/http: a blocked
		// write or read returns, and the server sees the call gone (a
		// streamed exec is killed). The response body keeps the hook until
		// it is read or closed.
		stop := context.AfterFunc(ctx, func() { _ = c.Close() })
		werr := req.Write(c.bw)
		if werr == nil {
			werr = c.bw.Flush()
		}
		if werr != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				stop()
				t.discard(c)
				return nil, ctxErr
			}
			// The server may have answered before it stopped reading (a
			// request over its size limit): that answer is the result.
			answered, closed := c.peer()
			if answered {
				if resp, ok := earlyResponse(c, req); ok {
					// The server closed the connection: never kept.
					return t.withBody(ctx, resp, c, stop, false), nil
				}
			}
			stop()
			t.discard(c)
			// The server closed a kept connection before it read the
			// request (net/http retries the same case): once on a new one.
			if reused && !retried && req.GetBody != nil && closed {
				if again, err := rewound(req); err == nil {
					req = again
					continue
				}
			}
			return nil, fmt.Errorf("send %s: %w", req.URL.Path, werr)
		}
		resp, err := http.ReadResponse(c.br, req)
		if err != nil {
			stop()
			t.discard(c)
			if ctxErr := ctx.Err(); ctxErr != nil {
				return nil, ctxErr
			}
			return nil, fmt.Errorf("read the response to %s: %w", req.URL.Path, err)
		}
		return t.withBody(ctx, resp, c, stop, !resp.Close && !req.Close), nil
	}
}

// withBody gives resp the body that owns c (and the cancellation hook
// stop) until it is read or closed; keep says c may then carry another
// call. An empty body lets c go at once.
func (t *h1Transport) withBody(ctx context.Context, resp *http.Response, c *h1Conn, stop func() bool, keep bool) *http.Response {
	b := &h1Body{t: t, c: c, ctx: ctx, body: resp.Body, stop: stop, keep: keep}
	if resp.Body == http.NoBody {
		b.release(true)
	}
	resp.Body = b
	return resp
}

// earlyWait bounds the wait for an answer the server may have sent before
// a request's write failed.
const earlyWait = time.Second

// earlyResponse reads a response the server sent on c before it stopped
// reading the request, if there is one.
func earlyResponse(c *h1Conn, req *http.Request) (*http.Response, bool) {
	if err := c.SetReadDeadline(time.Now().Add(earlyWait)); err != nil {
		return nil, false
	}
	resp, err := http.ReadResponse(c.br, req)
	if err != nil {
		return nil, false
	}
	_ = c.SetReadDeadline(time.Time{})
	return resp, true
}

// rewound is req with a fresh copy of its body, for a second attempt.
func rewound(req *http.Request) (*http.Request, error) {
	body, err := req.GetBody()
	if err != nil {
		return nil, err
	}
	req = req.Clone(req.Context())
	req.Body = body
	return req, nil
}

func closeRequestBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// get returns a kept connection if one is usable, else dials a new one
// while fewer than cap(slots) are open, else waits for either.
func (t *h1Transport) get(ctx context.Context) (c *h1Conn, reused bool, err error) {
	for {
		select {
		case c = <-t.idle:
		default:
			select {
			case c = <-t.idle:
			case t.slots <- struct{}{}:
				conn, err := t.dial(ctx)
				if err != nil {
					<-t.slots
					return nil, false, err
				}
				return &h1Conn{Conn: conn, br: bufio.NewReader(conn), bw: bufio.NewWriter(conn)}, false, nil
			case <-ctx.Done():
				return nil, false, ctx.Err()
			}
		}
		if c.usable(t.maxIdle) {
			return c, true, nil
		}
		t.discard(c)
	}
}

// usable reports whether a kept connection may carry another call: not
// kept too long, and the server has neither closed it nor sent anything
// unasked (net/http's reader goroutine's job).
func (c *h1Conn) usable(maxIdle time.Duration) bool {
	if time.Since(c.idleSince) > maxIdle {
		return false
	}
	sent, closed := c.peer()
	return !sent && !closed
}

// peer looks without blocking at what the server did: sent bytes not read
// yet, or closed its end (or both).
func (c *h1Conn) peer() (sent, closed bool) {
	if c.br.Buffered() > 0 {
		return true, false
	}
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return false, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false, true
	}
	var buf [1]byte
	err = raw.Read(func(fd uintptr) bool {
		n, _, perr := unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case n > 0:
			sent = true
		case perr == nil: // end of file
			closed = true
		case perr != unix.EAGAIN: // ECONNRESET and the like
			closed = true
		}
		return true
	})
	return sent, closed || err != nil
}

// put keeps c for the next call.
func (t *h1Transport) put(c *h1Conn) {
	c.idleSince = time.Now()
	t.idle <- c // never blocks: at most cap(slots) connections exist
	t.sweepLater()
}

// sweepLater schedules a sweep of the kept connections, unless one is.
func (t *h1Transport) sweepLater() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.sweeping {
		t.sweeping = true
		time.AfterFunc(t.maxIdle, t.sweep)
	}
}

// sweep closes the connections kept longer than maxIdle, and comes back
// later while any are left.
func (t *h1Transport) sweep() {
	t.mu.Lock()
	t.sweeping = false
	t.mu.Unlock()
	kept := false
	for range len(t.idle) {
		var c *h1Conn
		select {
		case c = <-t.idle:
		default: // taken by calls meanwhile
		}
		if c == nil {
			break
		}
		if time.Since(c.idleSince) > t.maxIdle {
			t.discard(c)
			continue
		}
		t.idle <- c
		kept = true
	}
	if kept {
		t.sweepLater()
	}
}

// discard closes c and frees its slot.
func (t *h1Transport) discard(c *h1Conn) {
	_ = c.Close()
	<-t.slots
}

// CloseIdleConnections closes the connections kept between calls.
func (t *h1Transport) CloseIdleConnections() {
	for {
		select {
		case c := <-t.idle:
			t.discard(c)
		default:
			return
		}
	}
}

// h1Body is a response body that gives its connection back once read to
// the end, or closes it when closed earlier (it still holds unread bytes).
type h1Body struct {
	t     *h1Transport
	c     *h1Conn
	ctx   context.Context // the request's: its end is the reason a read failed
	body  io.ReadCloser
	stop  func() bool // removes the cancellation hook; false if it ran
	keep  bool        // neither side asked to close the connection
	state atomic.Int32
}

// h1Body states: the connection is the body's, went back at the end of the
// body, or was closed.
const (
	bodyReading int32 = iota
	bodyEnded
	bodyClosed
)

var errBodyClosed = errors.New("corral client: read on a closed response body")

func (b *h1Body) Read(p []byte) (int, error) {
	switch b.state.Load() {
	case bodyEnded:
		return 0, io.EOF
	case bodyClosed:
		return 0, errBodyClosed
	}
	n, err := b.body.Read(p)
	switch {
	case err == io.EOF:
		b.release(true)
	case err != nil:
		if ctxErr := b.ctx.Err(); ctxErr != nil {
			err = ctxErr
		}
		b.release(false)
	}
	return n, err
}

// Close may come from another goroutine while Read blocks: closing the
// connection ends that Read.
func (b *h1Body) Close() error {
	b.release(false)
	return nil
}

// release hands the connection back (reuse, if nothing forbids it) or
// closes it; only the first call acts.
func (b *h1Body) release(reuse bool) {
	end := bodyClosed
	if reuse {
		end = bodyEnded
	}
	if !b.state.CompareAndSwap(bodyReading, end) {
		return
	}
	if b.stop() && reuse && b.keep {
		b.t.put(b.c)
		return
	}
	b.t.discard(b.c)
}
