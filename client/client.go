// Package client is corral's Go SDK. It speaks plain Go types and errors:
// nothing from the transport (Connect, protobuf) appears in its exported
// API, and it imports nothing from corral's internal packages.
//
//	c, err := client.New("unix:///var/lib/corral/corral.sock")
//	sb, err := c.Create(ctx, client.CreateOptions{Image: "busybox"})
//	defer sb.Delete(ctx)
//	res, err := sb.Run(ctx, client.Command{Args: []string{"echo", "hi"}})
package client

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
)

// DefaultAddress is where `corral serve` listens by default.
const DefaultAddress = "unix:///var/lib/corral/corral.sock"

// Client talks to a corral server. It is safe for concurrent use.
type Client struct {
	svc  corralv1connect.SandboxServiceClient
	fn   corralv1connect.FnCallServiceClient
	img  corralv1connect.ImageServiceClient
	http *http.Client

	// cluster is served by a cluster's control instances only.
	cluster corralv1connect.ClusterServiceClient
}

// Option configures a Client.
type Option func(*options)

type options struct {
	maxConns int
}

// WithMaxConnections caps the connections kept open to the server (default 256).
func WithMaxConnections(n int) Option { return func(o *options) { o.maxConns = n } }

// New connects to a corral server at addr: "unix:///path.sock", a bare
// "/path.sock", "http://host:port" or "host:port". No request is made until
// the first call.
func New(addr string, opts ...Option) (*Client, error) {
	o := options{maxConns: 256}
	for _, opt := range opts {
		opt(&o)
	}
	transport := &http.Transport{
		MaxIdleConns:        o.maxConns,
		MaxIdleConnsPerHost: o.maxConns,
		MaxConnsPerHost:     o.maxConns,
		IdleConnTimeout:     90 * time.Second,
	}
	baseURL, socket, err := parseAddress(addr)
	if err != nil {
		return nil, err
	}
	if socket != "" {
		transport.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}
	}
	hc := &http.Client{Transport: transport}
	copts := []connect.ClientOption{connect.WithSendMaxBytes(64 << 20), connect.WithReadMaxBytes(128 << 20)}
	return &Client{
		svc:  corralv1connect.NewSandboxServiceClient(hc, baseURL, copts...),
		fn:   corralv1connect.NewFnCallServiceClient(hc, baseURL, copts...),
		img:  corralv1connect.NewImageServiceClient(hc, baseURL, copts...),
		http: hc,

		cluster: corralv1connect.NewClusterServiceClient(hc, baseURL, copts...),
	}, nil
}

func parseAddress(addr string) (baseURL, socket string, err error) {
	switch {
	case addr == "":
		return "", "", fmt.Errorf("corral client: empty server address")
	case strings.HasPrefix(addr, "unix://"):
		return "http://corral", strings.TrimPrefix(addr, "unix://"), nil
	case strings.HasPrefix(addr, "/"):
		return "http://corral", addr, nil
	case strings.HasPrefix(addr, "http://"), strings.HasPrefix(addr, "https://"):
		return strings.TrimSuffix(addr, "/"), "", nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", "", fmt.Errorf("corral client: address %q is neither unix://PATH nor host:port", addr)
	}
	return "http://" + addr, "", nil
}

// Close releases idle connections.
func (c *Client) Close() error {
	c.http.CloseIdleConnections()
	return nil
}
