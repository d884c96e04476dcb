package vm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/corral-dev/corral/internal/backend"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentclient"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// Images that carry corral-agent (Image.Agent) get a second virtio-serial
// port, org.corral.agent.0, whose host end is agentSock; exec and files
// then speak the microVM agent's protocol (internal/guest/agentproto:
// yamux streams, streamed output and stdin, signals) instead of qemu-ga's
// JSON, which captures output until a command ends. qemu-ga stays in the
// image and on its port; images without the agent (imported ones) use it.
//
// The agent authenticates the node by the sandbox's secret. QEMU hands it
// to the guest as the fw_cfg item agentSecretName, read from a 0600 file
// of the run dir: only the node writes it, it reaches the guest out of
// band of every port (no guest process can intercept it on the way, as it
// could a secret sent as the port's first message to whoever opened the
// port first), and it is there again, unchanged, for a VM restored from
// its snapshot. In the guest only root can read it, and it only lets a
// caller on the host end of the port in.

const (
	agentSock       = "agent.sock"   // virtio-serial org.corral.agent.0
	agentSecretFile = "agent.secret" // fw_cfg opt/corral/agent-secret
)

// agentQEMUArgs adds the agent's port and secret for images with the agent.
func agentQEMUArgs(m *machine) []string {
	if !m.Agent {
		return nil
	}
	return []string{
		"-chardev", "socket,id=agent0,path=" + qemuvm.Escape(m.path(agentSock)) + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent0,name=" + agentPortName,
		"-fw_cfg", "name=" + agentSecretName + ",file=" + qemuvm.Escape(m.path(agentSecretFile)),
	}
}

// writeAgentSecret makes the sandbox's secret (kept in vm.json too) and
// its fw_cfg file, before QEMU starts.
func writeAgentSecret(m *machine) error {
	if !m.Agent {
		return nil
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return fmt.Errorf("agent secret: %w", err)
	}
	m.Secret = hex.EncodeToString(b)
	if err := os.WriteFile(m.path(agentSecretFile), []byte(m.Secret), 0o600); err != nil {
		return fmt.Errorf("agent secret: %w", err)
	}
	return nil
}

// agentConn is the node's end of corral-agent: one yamux session on the
// port's socket, dialled on first use and again after it dropped (daemon
// restart, snapshot restore).
type agentConn struct {
	*agentclient.Client
	path string
	// handshake: connections start with the port handshake
	// (machineState.PortHandshake).
	handshake bool
	// secret is what requests carry: a restore's first calls reach the
	// snapshot's agent with the snapshot's secret (setSecret).
	secret atomic.Pointer[string]

	mu   sync.Mutex
	sess *yamux.Session
}

// agentFor is the agent connection of a machine whose image has one.
func agentFor(m *machine) *agentConn {
	if !m.Agent {
		return nil
	}
	return newAgentConn(m.path(agentSock), m.Secret, m.PortHandshake)
}

func newAgentConn(path, secret string, handshake bool) *agentConn {
	a := &agentConn{path: path, handshake: handshake}
	a.setSecret(secret)
	a.Client = agentclient.New(a.session, func() string { return *a.secret.Load() })
	return a
}

func (a *agentConn) setSecret(secret string) { a.secret.Store(&secret) }

func (a *agentConn) session(ctx context.Context) (*yamux.Session, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sess != nil && !a.sess.IsClosed() {
		return a.sess, nil
	}
	var lastErr error
	for range sessionAttempts {
		sess, err := a.dial(ctx)
		if err != nil {
			return nil, err
		}
		if lastErr = a.prove(ctx, sess); lastErr == nil {
			a.sess = sess
			return sess, nil
		}
		sess.Close()
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errdefs.Unavailable("corral-agent session: %v", lastErr)
}

// sessionAttempts bounds the sessions dialled for one call.
const sessionAttempts = 3

func (a *agentConn) dial(ctx context.Context) (*yamux.Session, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", a.path)
	if err != nil {
		return nil, errdefs.Unavailable("connect to corral-agent: %v", err)
	}
	if a.handshake {
		if conn, err = agentproto.SyncPort(ctx, conn); err != nil {
			return nil, errdefs.Unavailable("corral-agent: %v", err)
		}
	}
	sess, err := agentclient.NewSession(conn)
	if err != nil {
		return nil, fmt.Errorf("corral-agent session: %w", err)
	}
	return sess, nil
}

// prove pings the agent on a new session before calls use it: the port is
// one byte stream under every session, and without the port handshake (an
// image built before it) the guest may still be serving or closing the
// last session when the next one's first frames arrive, which are then
// lost and the stream reset. Any reply proves the session, a refusal
// included. After the handshake the session is the agent's new one, so
// there is nothing to prove.
func (a *agentConn) prove(ctx context.Context, sess *yamux.Session) error {
	if a.handshake {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c := agentclient.New(func(context.Context) (*yamux.Session, error) { return sess, nil }, func() string { return *a.secret.Load() })
	_, err := c.Call(pctx, agentproto.Request{Op: agentproto.OpPing})
	if err != nil && (errdefs.IsUnavailable(err) || pctx.Err() != nil) {
		return err
	}
	return nil
}

// close drops the session (nil-safe: sandboxes without the agent).
func (a *agentConn) close() {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sess != nil {
		a.sess.Close()
		a.sess = nil
	}
}

// waitCorralAgent pings corral-agent until it answers, QEMU exits or
// timeout. The agent runs only on Linux guests (the images vm-image
// build makes), so the POSIX wrappers apply.
func (s *sandbox) waitCorralAgent(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := s.agent.Wait(ctx, s.Done(), agentclient.Waiting{Attempt: 5 * time.Second, Pause: 200 * time.Millisecond,
		Redial: s.agent.close})
	switch {
	case errors.Is(err, agentclient.ErrEnded):
		return fmt.Errorf("guest ended before corral-agent answered: %s", s.ExitReason())
	case err != nil:
		return fmt.Errorf("corral-agent not ready after %v: %w (console: %s)", timeout, err, qemuvm.TailFile(s.m.path(consoleFile), 400))
	}
	s.m.OS, s.m.Linux = "linux", true
	return s.m.save()
}

// agentExec is Exec through corral-agent (internal/guest/agentclient):
// output streams as the command writes it, stdin streams from
// StdinReader, a PTY exec runs on a terminal of the guest's, and the
// command's process group is killed on timeout or cancellation.
func (s *sandbox) agentExec(ctx context.Context, spec backend.ExecSpec, out backend.OutputFunc) (backend.ExecResult, error) {
	if len(spec.Argv) == 0 {
		return backend.ExecResult{}, errdefs.InvalidArgument("exec.argv: required")
	}
	// Shell commands run the guest's own /bin/sh: the whole VM is the
	// sandbox, so replacing it only affects that sandbox.
	res, err := s.agent.Exec(ctx, spec, out, s.Done())
	switch {
	case errors.Is(err, agentclient.ErrEnded):
		return res, fmt.Errorf("sandbox %s: exec %q: %w: %s", s.m.id, spec.Argv[0], err, s.ExitReason())
	case err != nil:
		return res, fmt.Errorf("sandbox %s: exec %q: %w", s.m.id, spec.Argv[0], err)
	}
	return res, nil
}

// The file operations of an agent image run in the guest with safefs on
// its root, as for a microVM.

// agentFileErr adds the sandbox, op and path to an agent error.
func (s *sandbox) agentFileErr(op, path string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("sandbox %s: %s %s: %w", s.m.id, op, path, err)
}

func (s *sandbox) agentWriteFile(ctx context.Context, path string, r io.Reader, opts backend.WriteOptions) (int64, error) {
	if err := checkPath("path", path); err != nil {
		return 0, err
	}
	n, err := s.agent.WriteFile(ctx, path, r, opts)
	return n, s.agentFileErr(agentproto.OpWrite, path, err)
}

func (s *sandbox) agentReadFile(ctx context.Context, path string, offset, limit int64) (io.ReadCloser, error) {
	if err := checkPath("path", path); err != nil {
		return nil, err
	}
	if offset < 0 || limit < 0 {
		return nil, errdefs.InvalidArgument("offset, limit: must not be negative")
	}
	rc, err := s.agent.ReadFile(ctx, path, offset, limit)
	return rc, s.agentFileErr(agentproto.OpRead, path, err)
}

func (s *sandbox) agentListDir(ctx context.Context, path string) ([]backend.FileInfo, error) {
	if err := checkPath("path", path); err != nil {
		return nil, err
	}
	out, err := s.agent.ListDir(ctx, path)
	return out, s.agentFileErr(agentproto.OpList, path, err)
}

func (s *sandbox) agentStat(ctx context.Context, path string) (backend.FileInfo, error) {
	if err := checkPath("path", path); err != nil {
		return backend.FileInfo{}, err
	}
	fi, err := s.agent.Stat(ctx, path)
	return fi, s.agentFileErr(agentproto.OpStat, path, err)
}

func (s *sandbox) agentRemove(ctx context.Context, path string, recursive bool) error {
	if err := checkPath("path", path); err != nil {
		return err
	}
	return s.agentFileErr(agentproto.OpRemove, path, s.agent.Remove(ctx, path, recursive))
}

func (s *sandbox) agentMakeDir(ctx context.Context, path string, mode fs.FileMode, parents bool) error {
	if err := checkPath("path", path); err != nil {
		return err
	}
	return s.agentFileErr(agentproto.OpMkdir, path, s.agent.MakeDir(ctx, path, mode, parents))
}
