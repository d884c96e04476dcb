// Package wsconn turns a websocket's binary messages into a byte stream
// (net.Conn): the live view's VNC travels so between the SDK, a control
// instance and a node. It imports nothing from corral, so the SDK may use
// it.
package wsconn

import (
	"errors"
	"io"
	"net"
	"time"

	"github.com/gorilla/websocket"
)

// New is ws as a net.Conn: each Write is one binary message, Read returns
// the binary messages' bytes in order (others are skipped), and the
// peer's close message reads as io.EOF.
func New(ws *websocket.Conn) net.Conn { return &conn{ws: ws} }

type conn struct {
	ws  *websocket.Conn
	cur io.Reader
}

func (c *conn) Read(p []byte) (int, error) {
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
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				return 0, io.EOF
			}
			return 0, err
		}
		if kind == websocket.BinaryMessage {
			c.cur = r
		}
	}
}

func (c *conn) Write(p []byte) (int, error) {
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *conn) Close() error                       { return c.ws.Close() }
func (c *conn) LocalAddr() net.Addr                { return c.ws.LocalAddr() }
func (c *conn) RemoteAddr() net.Addr               { return c.ws.RemoteAddr() }
func (c *conn) SetDeadline(t time.Time) error      { return c.ws.NetConn().SetDeadline(t) }
func (c *conn) SetReadDeadline(t time.Time) error  { return c.ws.SetReadDeadline(t) }
func (c *conn) SetWriteDeadline(t time.Time) error { return c.ws.SetWriteDeadline(t) }
