// Package client is corral's Go SDK. It speaks plain Go types and errors:
// nothing from the transport (Connect, protobuf) appears in its exported
// API, and of corral's internal packages it imports only internal/wsconn,
// a leaf (a websocket as a net.Conn, for the live view).
//
//	c, err := client.New("unix:///var/lib/corral/corral.sock")
//	sb, err := c.Create(ctx, client.CreateOptions{Image: "busybox"})
//	defer sb.Delete(ctx)
//	res, err := sb.Run(ctx, client.Command{Args: []string{"echo", "hi"}})
package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
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
	obs  corralv1connect.ObserveServiceClient
	iam  corralv1connect.IAMServiceClient
	roll corralv1connect.RolloutServiceClient
	mig  corralv1connect.MigrationServiceClient
	vm   corralv1connect.VMServiceClient
	http *http.Client
	// h2 carries bidirectional streams (exec with streamed stdin), which
	// Connect runs over HTTP/2 only; everything else uses HTTP/1.1.
	h2 corralv1connect.SandboxServiceClient
	// bulk reads file data without gzip, which costs far more CPU than a
	// local or datacenter link saves (and random data does not shrink).
	bulk corralv1connect.SandboxServiceClient

	// cluster is served by a cluster's control instances only.
	cluster corralv1connect.ClusterServiceClient

	// live dials live view websockets (liveview.go).
	live liveDialer
}

// Option configures a Client.
type Option func(*options)

type options struct {
	maxConns int
	token    *string
	tls      *tls.Config
}

// WithToken sends token as "Authorization: Bearer <token>" on every call
// (required on TCP; ignored on the node's unix socket, which is the node
// administrator). Without it, New uses $CORRAL_TOKEN; "" sends none.
func WithToken(token string) Option { return func(o *options) { o.token = &token } }

// WithTLSConfig sets the TLS configuration of https:// addresses (e.g. a
// RootCAs pool holding the server's certificate).
func WithTLSConfig(c *tls.Config) Option { return func(o *options) { o.tls = c } }

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
		TLSClientConfig:     o.tls,
	}
	token := os.Getenv("CORRAL_TOKEN")
	if o.token != nil {
		token = *o.token
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
	h2 := transport.Clone()
	h2.Protocols = new(http.Protocols)
	h2.Protocols.SetHTTP2(true)
	h2.Protocols.SetUnencryptedHTTP2(true)
	var rt, rt2 http.RoundTripper = transport, h2
	if strings.HasPrefix(baseURL, "http://") {
		rt = newH1Transport(o.maxConns, plainDialer(baseURL, socket))
	}
	if token != "" {
		rt = bearer{token: "Bearer " + token, next: rt}
		rt2 = bearer{token: "Bearer " + token, next: h2}
	}
	hc := &http.Client{Transport: rt}
	copts := []connect.ClientOption{connect.WithSendMaxBytes(64 << 20), connect.WithReadMaxBytes(128 << 20)}
	return &Client{
		svc:  corralv1connect.NewSandboxServiceClient(hc, baseURL, copts...),
		fn:   corralv1connect.NewFnCallServiceClient(hc, baseURL, copts...),
		img:  corralv1connect.NewImageServiceClient(hc, baseURL, copts...),
		obs:  corralv1connect.NewObserveServiceClient(hc, baseURL, copts...),
		iam:  corralv1connect.NewIAMServiceClient(hc, baseURL, copts...),
		roll: corralv1connect.NewRolloutServiceClient(hc, baseURL, copts...),
		mig:  corralv1connect.NewMigrationServiceClient(hc, baseURL, copts...),
		vm:   corralv1connect.NewVMServiceClient(hc, baseURL, copts...),
		http: hc,
		h2:   corralv1connect.NewSandboxServiceClient(&http.Client{Transport: rt2}, baseURL, copts...),
		bulk: corralv1connect.NewSandboxServiceClient(hc, baseURL,
			append(copts, connect.WithAcceptCompression("gzip", nil, nil))...),

		cluster: corralv1connect.NewClusterServiceClient(hc, baseURL, copts...),
		live:    liveDialer{baseURL: baseURL, dial: transport.DialContext, tls: o.tls},
	}, nil
}

// plainDialer connects to the node's unix socket, or else to the host of
// an http:// baseURL.
func plainDialer(baseURL, socket string) func(context.Context) (net.Conn, error) {
	network, address := "unix", socket
	if socket == "" {
		network, address = "tcp", strings.TrimPrefix(baseURL, "http://")
		address, _, _ = strings.Cut(address, "/")
		if _, _, err := net.SplitHostPort(address); err != nil {
			address = net.JoinHostPort(address, "80")
		}
	}
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
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

// bearer adds the token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", b.token)
	return b.next.RoundTrip(r)
}

// Close releases idle connections.
func (c *Client) Close() error {
	c.http.CloseIdleConnections()
	return nil
}

func (b bearer) CloseIdleConnections() {
	if c, ok := b.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// fromProtos converts each message of a response's list with conv.
func fromProtos[P, T any](ps []P, conv func(P) T) []T {
	out := make([]T, len(ps))
	for i, p := range ps {
		out[i] = conv(p)
	}
	return out
}

// streamResult reads a server stream until result finds the answer in a
// message (it takes the others as progress); what names the call when the
// stream ends without one.
func streamResult[M, T any](stream *connect.ServerStreamForClient[M], result func(*M) (T, bool), what string) (T, error) {
	defer stream.Close()
	for stream.Receive() {
		if v, ok := result(stream.Msg()); ok {
			return v, nil
		}
	}
	var zero T
	if err := stream.Err(); err != nil {
		return zero, wrapErr(err)
	}
	return zero, fmt.Errorf("%s: the stream ended without a result", what)
}
