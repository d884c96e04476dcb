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

	"github.com/corral-dev/corral/internal/wsconn"
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
	return wsconn.New(ws), nil
}

func trimNL(b []byte) string {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return string(b)
}
