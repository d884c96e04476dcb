package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/gorilla/websocket"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/internal/wsconn"
)

// LiveView is a one-time grant to watch and drive a vm sandbox's screen
// as VNC (RFB) over a websocket on the server's API listener.
type LiveView struct {
	// Path is the websocket's path, e.g. /v1/liveview/<id>; Token opens
	// one connection to it until Expires.
	Path, Token string
	Expires     time.Time
}

// URLPath is Path with the token as its query: append it to the server's
// address with scheme ws:// (wss:// with TLS).
func (lv LiveView) URLPath() string { return lv.Path + "?token=" + url.QueryEscape(lv.Token) }

// LiveView grants a live view of sandboxID's screen, keyboard and mouse;
// ttl (0: a minute, at most an hour) bounds how long the token waits for
// its one connection.
func (c *Client) LiveView(ctx context.Context, sandboxID string, ttl time.Duration) (LiveView, error) {
	secs := min(ttl/time.Second, math.MaxInt32) // the server names the limit
	resp, err := c.vm.LiveView(ctx, connect.NewRequest(&corralv1.LiveViewRequest{SandboxId: sandboxID, TtlSeconds: int32(secs)}))
	if err != nil {
		return LiveView{}, wrapErr(err)
	}
	return LiveView{Path: resp.Msg.Path, Token: resp.Msg.Token, Expires: time.Unix(resp.Msg.ExpiresUnix, 0)}, nil
}

// liveDialer opens websockets on the client's server address.
type liveDialer struct {
	baseURL string
	dial    func(ctx context.Context, network, addr string) (net.Conn, error) // nil: TCP
	tls     *tls.Config
}

// DialLiveView opens the live view lv grants (using up its token) and
// returns the VNC (RFB) byte stream: read the server's ProtocolVersion
// first, as from any VNC server.
func (c *Client) DialLiveView(ctx context.Context, lv LiveView) (net.Conn, error) {
	d := websocket.Dialer{NetDialContext: c.live.dial, TLSClientConfig: c.live.tls, HandshakeTimeout: time.Minute}
	u := "ws" + strings.TrimPrefix(c.live.baseURL, "http") + lv.URLPath()
	ws, resp, err := d.DialContext(ctx, u, nil)
	if err != nil {
		if resp != nil {
			defer resp.Body.Close()
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			return nil, fmt.Errorf("live view: HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		}
		return nil, fmt.Errorf("live view: %w", err)
	}
	return wsconn.New(ws), nil
}
