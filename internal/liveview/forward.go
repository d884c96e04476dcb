package liveview

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/gorilla/websocket"
)

// DialNode opens the live view endpoint of the node at addr (a control
// instance forwarding a viewer): scheme is "http://" or "https://" (then
// tlsConfig, for HTTP/1.1, is used), header carries the call's signature.
// A node's refusal comes back as a *StatusError with the node's status.
func DialNode(ctx context.Context, scheme, addr string, tlsConfig *tls.Config, header http.Header, sandbox, token string) (net.Conn, error) {
	u := "ws://"
	d := websocket.Dialer{HandshakeTimeout: 30 * time.Second, NetDialContext: (&net.Dialer{Timeout: 3 * time.Second}).DialContext}
	if scheme == "https://" {
		u = "wss://"
		cfg := tlsConfig.Clone()
		cfg.NextProtos = []string{"http/1.1"} // websockets upgrade HTTP/1.1
		d.TLSClientConfig = cfg
	}
	u += addr + Path(url.PathEscape(sandbox)) + "?token=" + url.QueryEscape(token)
	ws, resp, err := d.DialContext(ctx, u, header)
	if err != nil {
		if resp != nil {
			defer resp.Body.Close()
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			return nil, &StatusError{Code: resp.StatusCode, Msg: fmt.Sprintf("node %s: %s", addr, trimNL(msg))}
		}
		return nil, &StatusError{Code: http.StatusBadGateway, Msg: fmt.Sprintf("node %s: %v", addr, err)}
	}
	return &wsConn{ws: ws}, nil
}

func trimNL(b []byte) string {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return string(b)
}

// wsConn is a websocket's binary messages as a byte stream.
type wsConn struct {
	ws  *websocket.Conn
	cur io.Reader
}

func (c *wsConn) Read(p []byte) (int, error) {
	for {
		if c.cur != nil {
			n, err := c.cur.Read(p)
			if n > 0 {
				return n, nil
			}
			if err != io.EOF {
				return 0, err
			}
			c.cur = nil
		}
		kind, r, err := c.ws.NextReader()
		if err != nil {
			return 0, err
		}
		if kind == websocket.BinaryMessage {
			c.cur = r
		}
	}
}

func (c *wsConn) Write(p []byte) (int, error) {
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *wsConn) Close() error                       { return c.ws.Close() }
func (c *wsConn) LocalAddr() net.Addr                { return c.ws.LocalAddr() }
func (c *wsConn) RemoteAddr() net.Addr               { return c.ws.RemoteAddr() }
func (c *wsConn) SetDeadline(t time.Time) error      { return c.ws.NetConn().SetDeadline(t) }
func (c *wsConn) SetReadDeadline(t time.Time) error  { return c.ws.SetReadDeadline(t) }
func (c *wsConn) SetWriteDeadline(t time.Time) error { return c.ws.SetWriteDeadline(t) }
