package vm

import (
	"context"
	"net"

	"github.com/corral-dev/corral/internal/errdefs"
)

// vncSock is QEMU's VNC server (RFB, no authentication: only the node can
// open the run dir), which the live view relays to a token holder.
const vncSock = "vnc.sock"

// DialVNC implements backend.LiveViewer: a connection to the VM's VNC
// server.
func (s *sandbox) DialVNC(ctx context.Context) (net.Conn, error) {
	if err := s.Running(); err != nil {
		return nil, err
	}
	if s.Checkpointed() {
		return nil, errdefs.FailedPrecondition("sandbox %s: paused to a snapshot on disk: resume it first", s.m.id)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", s.m.path(vncSock))
	if err != nil {
		// A VM started by a corral without the live view has no socket.
		return nil, errdefs.Unavailable("sandbox %s: live view: %v", s.m.id, err)
	}
	return c, nil
}
