package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// h1Server is a net/http server on a unix socket that counts the
// connections it accepted and has open.
type h1Server struct {
	srv      *http.Server
	sock     string
	accepted atomic.Int32
	open     atomic.Int32
	maxOpen  atomic.Int32
}

func startH1Server(t *testing.T, h http.HandlerFunc) *h1Server {
	t.Helper()
	s := &h1Server{sock: filepath.Join(t.TempDir(), "api.sock")}
	l, err := net.Listen("unix", s.sock)
	if err != nil {
		t.Fatal(err)
	}
	s.srv = &http.Server{Handler: h, ConnState: func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.accepted.Add(1)
			n := s.open.Add(1)
			for m := s.maxOpen.Load(); n > m && !s.maxOpen.CompareAndSwap(m, n); m = s.maxOpen.Load() {
			}
		case http.StateClosed, http.StateHijacked:
			s.open.Add(-1)
		}
	}}
	go func() { _ = s.srv.Serve(l) }()
	t.Cleanup(func() { _ = s.srv.Close() })
	return s
}

func (s *h1Server) client(maxConns int) (*http.Client, *h1Transport) {
	tr := newH1Transport(maxConns, plainDialer("http://corral", s.sock))
	return &http.Client{Transport: tr}, tr
}

func post(ctx context.Context, c *http.Client, body string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://corral/echo", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func echo(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	_, _ = fmt.Fprintf(w, "got %s", b)
}

func TestH1TransportReusesOneConnection(t *testing.T) {
	s := startH1Server(t, echo)
	c, _ := s.client(4)
	for i := range 20 {
		got, err := post(t.Context(), c, fmt.Sprint(i))
		if err != nil || got != fmt.Sprintf("got %d", i) {
			t.Fatalf("call %d: %q, %v", i, got, err)
		}
	}
	if n := s.accepted.Load(); n != 1 {
		t.Fatalf("20 sequential calls opened %d connections, want 1", n)
	}
}

func TestH1TransportRedialsAfterServerClosedIdle(t *testing.T) {
	s := startH1Server(t, echo)
	c, _ := s.client(4)
	if _, err := post(t.Context(), c, "a"); err != nil {
		t.Fatal(err)
	}
	// The server drops its idle connections (a restart or an idle timeout);
	// the kept one must not fail the next call.
	s.srv.SetKeepAlivesEnabled(false) // closes idle connections
	waitFor(t, func() bool { return s.open.Load() == 0 })
	s.srv.SetKeepAlivesEnabled(true)
	got, err := post(t.Context(), c, "b")
	if err != nil || got != "got b" {
		t.Fatalf("call after the server closed the kept connection: %q, %v", got, err)
	}
	if n := s.accepted.Load(); n != 2 {
		t.Fatalf("%d connections accepted, want 2", n)
	}
}

func TestH1TransportClosesIdleConnections(t *testing.T) {
	s := startH1Server(t, echo)
	c, tr := s.client(4)
	tr.maxIdle = 100 * time.Millisecond
	if _, err := post(t.Context(), c, "a"); err != nil {
		t.Fatal(err)
	}
	if n := s.open.Load(); n != 1 {
		t.Fatalf("%d connections open after a call, want 1 kept", n)
	}
	// Left alone, the client lets go of the server.
	waitFor(t, func() bool { return s.open.Load() == 0 })
	if len(tr.slots) != 0 || len(tr.idle) != 0 {
		t.Fatalf("after the sweep: %d slots taken, %d kept, want none", len(tr.slots), len(tr.idle))
	}
	if got, err := post(t.Context(), c, "b"); err != nil || got != "got b" {
		t.Fatalf("call after the sweep: %q, %v", got, err)
	}
}

func TestH1TransportAnswerBeforeTheWholeRequest(t *testing.T) {
	s := startH1Server(t, func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<10))
		if err != nil {
			http.Error(w, "request over 1 KiB", http.StatusRequestEntityTooLarge)
			return
		}
		_, _ = fmt.Fprintf(w, "got %s", b)
	})
	c, tr := s.client(2)
	// The server answers and closes after reading part of the request: the
	// answer is the result, not the write that failed after it.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://corral/big", strings.NewReader(strings.Repeat("x", 16<<20)))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("a request over the server's limit: %v, want its answer", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "over 1 KiB") {
		t.Fatalf("a request over the server's limit: %d %q", resp.StatusCode, b)
	}
	if got, err := post(t.Context(), c, "small"); err != nil || got != "got small" {
		t.Fatalf("call after: %q, %v", got, err)
	}
	if len(tr.slots) != 1 {
		t.Fatalf("%d slots taken, want 1 (the refused call's connection closed)", len(tr.slots))
	}
}

func TestH1TransportCancelEndsBlockedCall(t *testing.T) {
	release := make(chan struct{})
	s := startH1Server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		echo(w, r)
	})
	defer close(release)
	c, tr := s.client(1)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://corral/block", strings.NewReader("x"))
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	waitFor(t, func() bool { return s.open.Load() == 1 })
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled call: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelling the context did not end the blocked call")
	}
	// Its connection is closed and its slot free: with one slot, the next
	// call still goes through.
	if got, err := post(t.Context(), c, "after"); err != nil || got != "got after" {
		t.Fatalf("call after a cancelled one: %q, %v", got, err)
	}
	if len(tr.slots) != 1 || len(tr.idle) != 1 {
		t.Fatalf("after the calls: %d slots taken, %d kept, want 1 and 1", len(tr.slots), len(tr.idle))
	}
}

func TestH1TransportStreamedBody(t *testing.T) {
	gone := make(chan struct{})
	s := startH1Server(t, func(w http.ResponseWriter, r *http.Request) {
		for i := range 3 {
			_, _ = fmt.Fprintf(w, "line %d\n", i)
			w.(http.Flusher).Flush()
		}
		if r.URL.Path == "/endless" {
			<-r.Context().Done()
			close(gone)
		}
	})
	c, tr := s.client(2)
	// Read to the end (chunked): the connection goes back.
	got, err := post(t.Context(), c, "")
	if err != nil || got != "line 0\nline 1\nline 2\n" {
		t.Fatalf("streamed body: %q, %v", got, err)
	}
	if len(tr.slots) != 1 || len(tr.idle) != 1 {
		t.Fatalf("after a body read to its end: %d slots taken, %d kept, want 1 and 1", len(tr.slots), len(tr.idle))
	}
	// Closed before its end: the connection holds unread bytes and is closed.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://corral/endless", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 7)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "line 0\n" {
		t.Fatalf("first line of an endless body: %q, %v", buf, err)
	}
	// The server learns of the cancel at once, with the body unread (a
	// streamed exec is killed then, not at the client's next read).
	cancel()
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not see the cancelled call end")
	}
	if _, err := io.ReadAll(resp.Body); !errors.Is(err, context.Canceled) {
		t.Fatalf("reading an endless body after cancel: %v, want context.Canceled", err)
	}
	resp.Body.Close()
	if _, err := resp.Body.Read(buf); err == nil {
		t.Fatal("read on a closed body succeeded")
	}
	// The stream reused the kept connection, and closed it.
	if len(tr.slots) != 0 || len(tr.idle) != 0 {
		t.Fatalf("after a cancelled stream: %d slots taken, %d kept, want none", len(tr.slots), len(tr.idle))
	}
	waitFor(t, func() bool { return s.open.Load() == 0 })
}

func TestH1TransportCapsConnections(t *testing.T) {
	var inside atomic.Int32
	gate := make(chan struct{})
	s := startH1Server(t, func(w http.ResponseWriter, r *http.Request) {
		inside.Add(1)
		<-gate
		echo(w, r)
	})
	c, _ := s.client(2)
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for i := range 5 {
		wg.Go(func() {
			got, err := post(t.Context(), c, fmt.Sprint(i))
			if err == nil && got != fmt.Sprintf("got %d", i) {
				err = fmt.Errorf("call %d answered %q", i, got)
			}
			errs <- err
		})
	}
	waitFor(t, func() bool { return inside.Load() == 2 })
	time.Sleep(50 * time.Millisecond) // time for a third connection, if the cap leaked
	if n := inside.Load(); n != 2 {
		t.Fatalf("%d calls reached the server with at most 2 connections", n)
	}
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if m := s.maxOpen.Load(); m > 2 {
		t.Fatalf("%d connections open at once, cap 2", m)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
