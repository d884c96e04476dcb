package node

import (
	"context"
	"net"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// screener is the sandbox's screen, or a clear error for backends that
// have none.
func screener(id string, sb backend.Sandbox) (backend.Screener, error) {
	sc, ok := sb.(backend.Screener)
	if !ok {
		return nil, errdefs.NotSupported("sandbox %s has no screen: screenshots and input are for sandboxes of backend vm", id)
	}
	return sc, nil
}

// Screenshot captures a sandbox's screen.
func (n *Node) Screenshot(ctx context.Context, id string, scale float64) (backend.Screenshot, error) {
	return withSandbox(ctx, n, id, func(sb backend.Sandbox) (backend.Screenshot, error) {
		sc, err := screener(id, sb)
		if err != nil {
			return backend.Screenshot{}, err
		}
		return sc.Screenshot(ctx, scale)
	})
}

// SendInput delivers keyboard and mouse events to a sandbox.
func (n *Node) SendInput(ctx context.Context, id string, events []backend.InputEvent) error {
	_, err := withSandbox(ctx, n, id, func(sb backend.Sandbox) (struct{}, error) {
		sc, err := screener(id, sb)
		if err != nil {
			return struct{}{}, err
		}
		if len(events) == 0 {
			return struct{}{}, errdefs.InvalidArgument("events: none given")
		}
		if len(events) > 1000 {
			return struct{}{}, errdefs.InvalidArgument("events: %d is over the limit of 1000 per call", len(events))
		}
		return struct{}{}, sc.SendInput(ctx, events)
	})
	return err
}

// DialVNC connects to a sandbox's VNC server for a live view. The
// sandbox counts as busy (never idle) until the connection is closed.
func (n *Node) DialVNC(ctx context.Context, id string) (net.Conn, error) {
	e, sb, err := n.acquire(ctx, id)
	if err != nil {
		return nil, err
	}
	lv, ok := sb.(backend.LiveViewer)
	if !ok {
		e.release()
		return nil, errdefs.NotSupported("sandbox %s has no screen: the live view is for sandboxes of backend vm", id)
	}
	c, err := lv.DialVNC(ctx)
	if err != nil {
		e.release()
		return nil, err
	}
	return &releasingConn{Conn: c, releaseOnce: releaseOnce{release: e.release}}, nil
}

type releasingConn struct {
	net.Conn
	releaseOnce
}

func (c *releasingConn) Close() error {
	err := c.Conn.Close()
	c.done()
	return err
}
