package node

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/state"
)

// Rename moves a file or directory inside the sandbox.
func (n *Node) Rename(ctx context.Context, id, from, to string) error {
	_, err := withSandbox(ctx, n, id, func(sb backend.Sandbox) (struct{}, error) {
		r, ok := sb.(backend.Renamer)
		if !ok {
			return struct{}{}, errdefs.NotSupported("not supported: rename on sandbox %s's backend", id)
		}
		return struct{}{}, r.Rename(ctx, from, to)
	})
	return err
}

// WatchDir reports changes in a directory of the sandbox until ctx ends
// (see backend.Watcher). The sandbox counts as busy while it is watched.
func (n *Node) WatchDir(ctx context.Context, id, path string, recursive bool, ready func(), fn func(backend.WatchEvent)) error {
	_, err := withSandbox(ctx, n, id, func(sb backend.Sandbox) (struct{}, error) {
		w, ok := sb.(backend.Watcher)
		if !ok {
			return struct{}{}, errdefs.NotSupported("not supported: watching directories on sandbox %s's backend", id)
		}
		return struct{}{}, w.WatchDir(ctx, path, recursive, ready, fn)
	})
	return err
}

// SetEndAt makes a running or paused sandbox stop at t (or, with
// pauseAtEnd true, be paused then; nil keeps the choice), by setting its
// max_lifetime to t minus its creation time (within the node's limit).
func (n *Node) SetEndAt(_ context.Context, id string, t time.Time, pauseAtEnd *bool) error {
	e, err := n.lookup(id)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.deleting {
		return errdefs.NotFound("sandbox %s is being deleted", id)
	}
	if e.rec.Phase == state.PhaseStopped {
		return errdefs.FailedPrecondition("sandbox %s is stopped (%s)", id, e.rec.StopReason)
	}
	life := t.Sub(e.rec.CreatedAt)
	if max := n.cfg.Limits.MaxLifetime; life > max {
		return errdefs.InvalidArgument("timeout: the sandbox would live %s, over the limit of %s", life.Round(time.Second), max)
	}
	if life < 0 {
		life = 0
	}
	e.rec.MaxLifetime = life
	if pauseAtEnd != nil {
		e.rec.PauseAtEnd = *pauseAtEnd
	}
	e.touch()
	n.putLocked(e)
	n.log.Debug("sandbox end moved", "sandbox", id, "end_at", t.Format(time.RFC3339), "max_lifetime", fmt.Sprint(life))
	return nil
}

// Usage reports a sandbox's resource use. It does not count as activity
// and does not resume a paused sandbox.
func (n *Node) Usage(ctx context.Context, id string) (backend.Usage, error) {
	e, err := n.lookup(id)
	if err != nil {
		return backend.Usage{}, err
	}
	sb := e.live()
	if sb == nil {
		return backend.Usage{}, errdefs.FailedPrecondition("sandbox %s is stopped", id)
	}
	u, ok := sb.(backend.Usager)
	if !ok {
		return backend.Usage{}, errdefs.NotSupported("not supported: resource use of sandbox %s's backend", id)
	}
	return u.Usage(ctx)
}

// Chown changes a file's owner inside the sandbox (ids as it sees them).
func (n *Node) Chown(ctx context.Context, id, path string, uid, gid uint32) error {
	_, err := withSandbox(ctx, n, id, func(sb backend.Sandbox) (struct{}, error) {
		c, ok := sb.(backend.Chowner)
		if !ok {
			return struct{}{}, errdefs.NotSupported("not supported: changing owners on sandbox %s's backend", id)
		}
		return struct{}{}, c.Chown(ctx, path, uid, gid)
	})
	return err
}

// DialPort connects to a TCP port on the sandbox's loopback (a paused
// sandbox is resumed first).
func (n *Node) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	return withSandbox(ctx, n, id, func(sb backend.Sandbox) (net.Conn, error) {
		d, ok := sb.(backend.PortDialer)
		if !ok {
			return nil, errdefs.NotSupported("not supported: reaching ports of sandbox %s's backend", id)
		}
		return d.DialPort(ctx, port)
	})
}
