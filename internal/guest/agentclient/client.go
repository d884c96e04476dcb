// Package agentclient is the node's client of corral-agent, shared by the
// backends whose guests run it (microvm over vsock or virtio-serial, vm
// over a virtio-serial port): it opens streams on a yamux session with the
// sandbox's secret and each op's protocol version, and carries the
// request/reply, exec, file and tree operations of internal/guest/agentproto.
// The backend keeps its transport (how it dials, when it redials, what a
// paused guest means) and adds its own error context (the sandbox, the op).
//
// It may import internal/guest/agentproto, internal/errdefs,
// internal/backend (types only) and yamux; never the node, state or API.
package agentclient

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// Client speaks to one sandbox's corral-agent. session returns the live
// session (the backend dials and redials); secret is read per request, as
// a restore briefly speaks with the snapshot's old secret.
type Client struct {
	session func(context.Context) (*yamux.Session, error)
	secret  func() string
}

// New is a client over a backend's session and secret.
func New(session func(context.Context) (*yamux.Session, error), secret func() string) *Client {
	return &Client{session: session, secret: secret}
}

// NewSession starts the node's yamux session on a dialled connection,
// closing conn if that fails.
func NewSession(conn net.Conn) (*yamux.Session, error) {
	yc := yamux.DefaultConfig()
	yc.EnableKeepAlive = false // a paused VM must not look dead
	yc.LogOutput = io.Discard
	yc.ConnectionWriteTimeout = time.Minute
	sess, err := yamux.Client(conn, yc)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return sess, nil
}

func (c *Client) openStream(ctx context.Context) (*yamux.Stream, error) {
	sess, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	st, err := sess.OpenStream()
	if err != nil {
		return nil, errdefs.Unavailable("corral-agent stream: %v", err)
	}
	return st, nil
}

func (c *Client) request(fs *agentproto.Stream, req agentproto.Request) error {
	req.Version, req.Secret = agentproto.RequestVersion(&req), c.secret()
	return fs.WriteJSON(agentproto.KindRequest, req)
}

// replyErr is a reply's error; an older agent's refusal of the request's
// version becomes a not-supported error naming the missing capability.
func replyErr(req *agentproto.Request, r agentproto.Reply) error {
	err := r.Err()
	if err != nil && agentproto.RefusedVersion(err) {
		return errdefs.NotSupported("not supported: %s by the corral-agent in this guest (needs agent protocol version %d; rebuild the image with this corral's agent): %v",
			agentproto.Capability(req), agentproto.RequestVersion(req), err)
	}
	return err
}

// Stream opens a stream and sends req; nothing is read back (the reply
// of a write or tree op comes after or among the data).
func (c *Client) Stream(ctx context.Context, req agentproto.Request) (*yamux.Stream, *agentproto.Stream, error) {
	st, err := c.openStream(ctx)
	if err != nil {
		return nil, nil, err
	}
	fs := agentproto.NewStream(st)
	if err := c.request(fs, req); err != nil {
		st.Close()
		return nil, nil, errdefs.Unavailable("corral-agent: %v", err)
	}
	return st, fs, nil
}

// Open starts one operation: a stream with the request sent and the first
// reply read. ctx bounds only this opening.
func (c *Client) Open(ctx context.Context, req agentproto.Request) (*yamux.Stream, *agentproto.Stream, agentproto.Reply, error) {
	var r agentproto.Reply
	st, err := c.openStream(ctx)
	if err != nil {
		return nil, nil, r, err
	}
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	defer stop()
	fs := agentproto.NewStream(st)
	if err = c.request(fs, req); err == nil {
		err = fs.ReadJSON(agentproto.KindReply, &r)
	}
	if err != nil {
		st.Close()
		if ctx.Err() != nil {
			return nil, nil, r, ctx.Err()
		}
		return nil, nil, r, errdefs.Unavailable("corral-agent: %v", err)
	}
	if err := replyErr(&req, r); err != nil {
		st.Close()
		return nil, nil, r, err
	}
	return st, fs, r, nil
}

// Call is a request with a single reply.
func (c *Client) Call(ctx context.Context, req agentproto.Request) (agentproto.Reply, error) {
	st, _, r, err := c.Open(ctx, req)
	if err != nil {
		return r, err
	}
	st.Close()
	return r, nil
}

// Waiting says how a backend waits for its guest's agent.
type Waiting struct {
	// Attempt bounds each ping: bytes sent before the guest opened its
	// port may be lost, and a fresh session is the way to resend.
	Attempt time.Duration
	// Pause is the time between a failed ping and the next.
	Pause time.Duration
	// Clock stamps each ping with the node's time, for a guest that sets
	// its clock from it.
	Clock bool
	// Redial drops the backend's session after a failed ping.
	Redial func()
}

// Wait pings the agent until it answers, done closes (ErrEnded) or ctx
// ends (the last ping's error).
func (c *Client) Wait(ctx context.Context, done <-chan struct{}, w Waiting) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		req := agentproto.Request{Op: agentproto.OpPing}
		if w.Clock {
			req.Now = time.Now().UnixNano()
		}
		actx, acancel := context.WithTimeout(ctx, w.Attempt)
		_, err := c.Call(actx, req)
		acancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return ErrEnded
		default:
		}
		if ctx.Err() != nil {
			return err
		}
		w.Redial()
		time.Sleep(w.Pause)
	}
}
