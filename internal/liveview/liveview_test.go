package liveview

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/testenv/accept"
)

func TestTokens(t *testing.T) {
	tok := NewTokens()
	now := time.Unix(1000, 0)
	tok.now = func() time.Time { return now }

	a, exp, err := tok.Issue("sb-a", 0)
	if err != nil || !exp.Equal(now.Add(DefaultTTL)) {
		t.Fatalf("issue: %v, expires %v", err, exp)
	}
	if err := tok.Redeem("sb-a", a[:len(a)-1]+"x"); err == nil {
		t.Error("a token with a changed secret was accepted")
	}
	if err := tok.Redeem("sb-a", "nodot"); err == nil {
		t.Error("a malformed token was accepted")
	}
	if err := tok.Redeem("sb-b", a); err == nil {
		t.Error("sandbox a's token opened sandbox b")
	}
	if err := tok.Redeem("sb-a", a); err != nil {
		t.Errorf("redeem: %v", err)
	}
	if err := tok.Redeem("sb-a", a); err == nil {
		t.Error("a token was used twice")
	}

	short, _, err := tok.Issue("sb-a", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	if err := tok.Redeem("sb-a", short); err == nil {
		t.Error("an expired token was accepted")
	}

	for _, ttl := range []time.Duration{-time.Second, MaxTTL + time.Second} {
		if _, _, err := tok.Issue("sb-a", ttl); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "ttl_seconds") {
			t.Errorf("ttl %v: %v, want invalid_argument naming ttl_seconds", ttl, err)
		}
	}
	// Waiting tokens are bounded; expired ones make room.
	for i := 0; i < maxTokens; i++ {
		if _, _, err := tok.Issue("sb-a", time.Minute); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
	}
	if _, _, err := tok.Issue("sb-a", time.Minute); !errdefs.IsResourceExhausted(err) {
		t.Errorf("token %d: %v, want resource_exhausted", maxTokens+1, err)
	}
	now = now.Add(time.Minute)
	if _, _, err := tok.Issue("sb-a", time.Minute); err != nil {
		t.Errorf("after expiry: %v", err)
	}
}

// TestHandlerRelays: refused tokens never reach Dial; an accepted one
// relays binary messages both ways over a real unix socket, and the
// socket's end closes the websocket.
func TestHandlerRelays(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "vnc.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// An echo server that hangs up after its first reply.
	accept.Each(ln, func(c net.Conn) {
		buf := make([]byte, 64)
		n, _ := c.Read(buf)
		_, _ = c.Write(append([]byte("echo:"), buf[:n]...))
		c.Close()
	})
	var dials atomic.Int32
	tokens := NewTokens()
	h := &Handler{Open: Local(tokens, func(ctx context.Context, id string) (net.Conn, error) {
		dials.Add(1)
		if id != "sb-a" {
			return nil, errdefs.NotFound("sandbox %s", id)
		}
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})}
	mux := http.NewServeMux()
	mux.Handle(PathPrefix, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer h.Close()
	wsURL := "ws" + strings.TrimPrefix(srv.URL, "http")

	tok, _, err := tokens.Issue("sb-a", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want int
	}{
		{Path("sb-a"), http.StatusUnauthorized},
		{Path("sb-a") + "?token=x.y", http.StatusForbidden},
		{Path("sb-b") + "?token=" + tok, http.StatusForbidden},
	} {
		_, resp, err := websocket.DefaultDialer.Dial(wsURL+c.path, nil)
		if err == nil || resp == nil || resp.StatusCode != c.want {
			t.Errorf("%s: %v, %v; want HTTP %d", c.path, resp, err, c.want)
		}
	}
	if n := dials.Load(); n != 0 {
		t.Fatalf("refused tokens dialled %d times", n)
	}

	ws, _, err := websocket.DefaultDialer.Dial(wsURL+Path("sb-a")+"?token="+tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if err := ws.WriteMessage(websocket.BinaryMessage, []byte("RFB")); err != nil {
		t.Fatal(err)
	}
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	kind, p, err := ws.ReadMessage()
	if err != nil || kind != websocket.BinaryMessage || string(p) != "echo:RFB" {
		t.Fatalf("relay: %d %q %v", kind, p, err)
	}
	_, _, err = ws.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseGoingAway {
		t.Fatalf("after the VNC server hung up: %v, want close going away", err)
	}
}
