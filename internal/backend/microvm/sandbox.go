package microvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/corral-dev/corral/internal/backend"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentclient"
	"github.com/corral-dev/corral/internal/guest/agentproto"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// sandbox implements backend.Sandbox for one VM; its VMM's pause,
// snapshot, restore and stop are the shared qemuvm.Lifecycle's.
type sandbox struct {
	*qemuvm.Lifecycle
	b     *Backend
	m     *machine
	rec   []byte
	agent *agentclient.Client // over sess

	// detaching: a snapshot's detach of the agent is under way, which
	// runs while the Lifecycle holds its lock (so Serving would wait).
	detaching atomic.Bool

	sessMu sync.Mutex
	sess   *yamux.Session
}

var (
	_ backend.Sandbox      = (*sandbox)(nil)
	_ backend.ExitReasoner = (*sandbox)(nil)
	_ backend.Networker    = (*sandbox)(nil)
)

// newSandbox is the sandbox of a running VMM, or of a VM in its snapshot
// file when proc is nil.
func (b *Backend) newSandbox(m *machine, proc *launch.Process) *sandbox {
	s := &sandbox{b: b, m: m, rec: recordOf(m)}
	s.agent = agentclient.New(s.session, func() string { return s.m.Secret })
	s.Lifecycle = qemuvm.NewLifecycle(qemuvm.LifecycleConfig{ID: m.id, Ops: lifecycleOps{s}, Net: m.net,
		SnapshotAfter: b.cfg.SnapshotAfter, Log: b.log}, proc)
	return s
}

func (s *sandbox) ID() string     { return s.m.id }
func (s *sandbox) Record() []byte { return s.rec }

// session returns the yamux session to the agent, dialling a new one when
// there is none (first use, after a daemon restart or a restore).
func (s *sandbox) session(ctx context.Context) (*yamux.Session, error) {
	if !s.detaching.Load() {
		// A stopped guest cannot answer: a call would wait out yamux's
		// write timeout and then lose the session. The node resumes
		// before a call.
		if err := s.Serving(); err != nil {
			return nil, err
		}
	}
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	if s.sess != nil && !s.sess.IsClosed() {
		return s.sess, nil
	}
	conn, err := s.b.drv.DialAgent(ctx, s.m)
	if err != nil {
		return nil, errdefs.Unavailable("sandbox %s: connect to agent: %v", s.m.id, err)
	}
	sess, err := agentclient.NewSession(conn)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: agent session: %w", s.m.id, err)
	}
	s.sess = sess
	return sess, nil
}

// waitAgent pings the agent until it answers, the VMM exits or timeout.
func (s *sandbox) waitAgent(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := s.agent.Wait(ctx, s.Done(), agentclient.Waiting{Attempt: 3 * time.Second, Pause: 50 * time.Millisecond,
		Clock: true, Redial: s.dropSession})
	switch {
	case errors.Is(err, agentclient.ErrEnded):
		return fmt.Errorf("guest ended before its agent answered: %s", s.ExitReason())
	case err != nil:
		return fmt.Errorf("agent not ready after %v: %w (console: %s)", timeout, err, qemuvm.TailFile(s.m.path(consoleFile), 500))
	}
	return nil
}

func (s *sandbox) dropSession() {
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	if s.sess != nil {
		s.sess.Close()
		s.sess = nil
	}
}

// UpdateNetwork implements backend.Networker.
func (s *sandbox) UpdateNetwork(ctx context.Context, n backend.Network) error {
	return s.Lifecycle.UpdateNetwork(ctx, n, func(rec *netpolicy.Record) error {
		s.m.Net = rec
		return s.m.save()
	})
}

// lifecycleOps drives the VMM through the driver for qemuvm.Lifecycle.
type lifecycleOps struct{ s *sandbox }

func (o lifecycleOps) Halt(ctx context.Context) error     { return o.s.b.drv.Pause(ctx, o.s.m) }
func (o lifecycleOps) Continue(ctx context.Context) error { return o.s.b.drv.Resume(ctx, o.s.m) }
func (o lifecycleOps) Hibernate(ctx context.Context) error {
	return o.s.b.drv.Snapshot(ctx, o.s.m)
}
func (o lifecycleOps) Restore(ctx context.Context) (*launch.Process, error) {
	return o.s.b.restore(ctx, o.s.m)
}
func (o lifecycleOps) WaitAgent(ctx context.Context, timeout time.Duration) error {
	return o.s.waitAgent(ctx, timeout)
}
func (o lifecycleOps) Disconnect() { o.s.dropSession() }

func (o lifecycleOps) Hibernated() error {
	o.s.m.Hibernated()
	return o.s.m.save()
}

// DetachAgent tells the agent to start a fresh session, then drops ours.
func (o lifecycleOps) DetachAgent(ctx context.Context) error {
	s := o.s
	s.detaching.Store(true)
	_, err := s.agent.Call(ctx, agentproto.Request{Op: agentproto.OpDetach})
	s.detaching.Store(false)
	s.dropSession()
	return err
}

// ExitReason reads why the VM ended from its console and QEMU's log.
func (o lifecycleOps) ExitReason() string {
	m := o.s.m
	console := qemuvm.TailFile(m.path(consoleFile), 4096)
	if i := strings.Index(console, "Kernel panic"); i >= 0 {
		line, _, _ := strings.Cut(console[i:], "\n")
		return "guest kernel panic: " + strings.TrimSpace(line)
	}
	if i := strings.LastIndex(console, "corral-agent: "); i >= 0 {
		// The agent's last word, unless it is the "ready" of a normal boot.
		if line, _, _ := strings.Cut(console[i:], "\n"); strings.TrimSpace(line) != "corral-agent: ready" {
			return "guest agent ended: " + strings.TrimSpace(line)
		}
	}
	if log := qemuvm.TailFile(m.path("qemu.log"), 300); log != "" {
		return "vmm exited: " + log
	}
	return "vmm exited"
}

// restore starts the VMM from the snapshot. QEMU wants an initrd on its
// command line although the guest's RAM comes from the snapshot: the base
// initramfs (without any secret) serves.
func (b *Backend) restore(ctx context.Context, m *machine) (*launch.Process, error) {
	if err := os.Symlink(b.init.path, m.path(initrdFile)); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	defer os.Remove(m.path(initrdFile))
	proc, err := b.drv.Start(ctx, m, true)
	if err != nil {
		return nil, err
	}
	return m.Restored(proc, m.save, m.path(snapshotFile))
}
