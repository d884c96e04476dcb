package wsconn

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
)

// TestBinaryMessagesAreAStream: the peer's binary messages read as one
// byte stream (a text message is skipped), a Write is one binary message,
// and the peer's close reads as io.EOF.
func TestBinaryMessagesAreAStream(t *testing.T) {
	var up websocket.Upgrader
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		_ = ws.WriteMessage(websocket.BinaryMessage, []byte("RFB 003"))
		_ = ws.WriteMessage(websocket.TextMessage, []byte("not VNC"))
		_ = ws.WriteMessage(websocket.BinaryMessage, []byte(".008\n"))
		kind, p, err := ws.ReadMessage()
		if err == nil && kind == websocket.BinaryMessage {
			_ = ws.WriteMessage(websocket.BinaryMessage, append([]byte("echo:"), p...))
		}
		_ = ws.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"))
	}))
	defer srv.Close()
	ws, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := New(ws)
	defer c.Close()
	hello := make([]byte, 12)
	if _, err := io.ReadFull(c, hello); err != nil || string(hello) != "RFB 003.008\n" {
		t.Fatalf("read %q, %v", hello, err)
	}
	if n, err := c.Write([]byte("hi")); n != 2 || err != nil {
		t.Fatalf("write: %d %v", n, err)
	}
	rest, err := io.ReadAll(c)
	if err != nil || string(rest) != "echo:hi" {
		t.Errorf("after the write: %q, %v (want the echo, then EOF at the close)", rest, err)
	}
}
