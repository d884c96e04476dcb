package launch

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/guest/initproto"
	"golang.org/x/sys/unix"
)

// fakeInit serves execs as init does (started, then exit 0) on a
// SOCK_SEQPACKET socket, counting accepted connections; closeIdle closes the
// connections that wait for a request (as an init that is gone).
type fakeInit struct {
	path     string
	accepted atomic.Int32
	kills    atomic.Int32
	mu       sync.Mutex
	idle     map[*initproto.Conn]bool
}

func (f *fakeInit) closeIdle() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.idle {
		c.Close()
		delete(f.idle, c)
	}
}

func startFakeInit(t *testing.T) *fakeInit {
	t.Helper()
	f := &fakeInit{path: filepath.Join(t.TempDir(), "ctl"), idle: map[*initproto.Conn]bool{}}
	ln, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(ln, &unix.SockaddrUnix{Name: f.path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(ln, 16); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Shutdown(ln, unix.SHUT_RDWR); unix.Close(ln) })
	go func() {
		for {
			fd, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
			if err != nil {
				return
			}
			c, err := initproto.NewConn(fd, "conn")
			if err != nil {
				continue
			}
			// Idle before counted: a test that saw the count may close it.
			f.mu.Lock()
			f.idle[c] = true
			f.mu.Unlock()
			f.accepted.Add(1)
			go f.serve(c)
		}
	}()
	return f
}

// serve answers every request on c as init 14 does: an exec with started
// (unless NoStarted) and exit; kills are counted.
func (f *fakeInit) serve(c *initproto.Conn) {
	defer c.Close()
	for {
		var req initproto.Request
		fds, err := c.Recv(&req)
		for _, fd := range fds {
			unix.Close(fd)
		}
		f.mu.Lock()
		delete(f.idle, c)
		f.mu.Unlock()
		if err != nil {
			return
		}
		if req.Op == initproto.OpKill {
			f.kills.Add(1)
			continue
		}
		if !req.Exec.NoStarted {
			_ = c.Send(initproto.Reply{Op: initproto.OpStarted, Pid: 42})
		}
		f.mu.Lock()
		f.idle[c] = true // until the next request
		f.mu.Unlock()
		_ = c.Send(initproto.Reply{Op: initproto.OpExit})
	}
}

func execOnce(t *testing.T, c Client) {
	t.Helper()
	e := startExec(t, c, false)
	defer e.Close()
	select {
	case x := <-e.Exited():
		if x.Err != nil {
			t.Fatalf("exit: %v", x.Err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit")
	}
}

// TestClientKeepsAConnectionForTheNextExec: an exec takes the connection
// dialed during the one before (each exec costs init one accept, not two
// in turn), a kept connection init dropped is replaced by a dial, and
// Close releases it.
func TestClientKeepsAConnectionForTheNextExec(t *testing.T) {
	f := startFakeInit(t)
	c := NewClient(f.path)
	for range 5 {
		execOnce(t, c)
	}
	// Five execs: the first dialed, each dialed the next one's while it ran.
	waitFor(t, func() bool { return f.accepted.Load() == 6 }, "6 connections for 5 execs")
	waitFor(t, func() bool {
		c.spare.mu.Lock()
		defer c.spare.mu.Unlock()
		return c.spare.conn != nil
	}, "a connection kept after an exec")

	// The kept connection's peer goes away: the next exec notices on its
	// send, dials, and keeps another.
	f.closeIdle()
	execOnce(t, c)
	waitFor(t, func() bool { return f.accepted.Load() == 8 }, "a dial after the dropped connection, and the next kept one")

	c.Close()
	c.spare.mu.Lock()
	kept := c.spare.conn
	c.spare.mu.Unlock()
	if kept != nil {
		t.Error("Close left a connection kept")
	}
	// A closed Client still works; it dials per exec and keeps nothing.
	execOnce(t, c)
	if c.spare.conn != nil {
		t.Error("a closed Client kept a connection")
	}
}

// TestClientReusesExecConnections: with ReuseConns, execs one after the
// other take turns on one connection; an exec not seen to end, or a
// connection init dropped, is not reused; a Signal after Close sends
// nothing.
func TestClientReusesExecConnections(t *testing.T) {
	f := startFakeInit(t)
	c := NewClient(f.path)
	if c.ReusesConns() {
		t.Fatal("a new Client reuses connections")
	}
	c.ReuseConns()
	if !c.ReusesConns() {
		t.Fatal("ReusesConns after ReuseConns: false")
	}
	for range 5 {
		execOnce(t, c)
	}
	if n := f.accepted.Load(); n != 1 {
		t.Fatalf("%d connections for 5 execs one after the other, want 1", n)
	}

	e := startExec(t, c, false)
	<-e.Exited()
	e.Close()
	if err := e.Signal(9); err == nil {
		t.Error("Signal after Close: no error")
	}
	execOnce(t, c)
	if n, k := f.accepted.Load(), f.kills.Load(); n != 1 || k != 0 {
		t.Fatalf("after a Signal past Close: %d connections, %d kills sent; want 1, 0", n, k)
	}

	// Closed before its exit was read: dropped, the next exec dials.
	e = startExec(t, c, true)
	e.Close()
	<-e.Exited()
	execOnce(t, c)
	if n := f.accepted.Load(); n != 2 {
		t.Fatalf("%d connections after an exec closed before its end, want 2", n)
	}

	f.closeIdle()
	execOnce(t, c)
	if n := f.accepted.Load(); n != 3 {
		t.Fatalf("%d connections after init dropped the kept one, want 3", n)
	}
}

// startExec starts `true` with a pipe's write end as stdout and stderr.
func startExec(t *testing.T, c Client, noStarted bool) *Exec {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	e, err := c.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"true"}, NoStarted: noStarted}, [3]int{int(w.Fd()), int(w.Fd()), -1})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
