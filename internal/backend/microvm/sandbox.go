package microvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
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

// sandbox implements backend.Sandbox for one VM.
type sandbox struct {
	b   *Backend
	m   *machine
	rec []byte

	done     chan struct{}
	doneOnce sync.Once

	mu      sync.Mutex
	proc    *launch.Process // nil while snapshotted
	sess    *yamux.Session
	agent   *agentclient.Client // over sess
	paused  bool
	stopped bool
	// quitProc is the VMM whose exit the sandbox asked for (snapshot,
	// stop): that exit does not end the sandbox.
	quitProc *launch.Process
	timer    *time.Timer // pending snapshot of a paused VM
	reason   string
}

var (
	_ backend.Sandbox      = (*sandbox)(nil)
	_ backend.ExitReasoner = (*sandbox)(nil)
)

func (b *Backend) newSandbox(m *machine, proc *launch.Process) *sandbox {
	s := &sandbox{b: b, m: m, rec: recordOf(m), done: make(chan struct{})}
	s.agent = agentclient.New(s.session, func() string { return s.m.Secret })
	s.setProc(proc)
	return s
}

func (b *Backend) newSnapshotted(m *machine) *sandbox {
	s := &sandbox{b: b, m: m, rec: recordOf(m), done: make(chan struct{}), paused: true}
	s.agent = agentclient.New(s.session, func() string { return s.m.Secret })
	return s
}

// setProc installs a VMM process and watches it: an exit nobody asked for
// ends the sandbox.
func (s *sandbox) setProc(proc *launch.Process) {
	s.proc = proc
	go func() {
		<-proc.Done()
		s.mu.Lock()
		expected := s.quitProc == proc
		if !expected {
			s.reason = s.exitReason()
		}
		s.mu.Unlock()
		if !expected {
			s.end()
		}
	}()
}

func (s *sandbox) end() { s.doneOnce.Do(func() { close(s.done) }) }

// exitReason reads why the VM ended from its console and QEMU's log.
func (s *sandbox) exitReason() string {
	console := qemuvm.TailFile(s.m.path(consoleFile), 4096)
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
	if log := qemuvm.TailFile(s.m.path("qemu.log"), 300); log != "" {
		return "vmm exited: " + log
	}
	return "vmm exited"
}

func (s *sandbox) ID() string            { return s.m.id }
func (s *sandbox) Record() []byte        { return s.rec }
func (s *sandbox) Done() <-chan struct{} { return s.done }

// ExitReason implements backend.ExitReasoner.
func (s *sandbox) ExitReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reason
}

func (s *sandbox) live() error {
	select {
	case <-s.done:
		return errdefs.FailedPrecondition("sandbox %s: not running", s.m.id)
	default:
		return nil
	}
}

// session returns the yamux session to the agent, dialling a new one when
// there is none (first use, after a daemon restart or a restore).
func (s *sandbox) session(ctx context.Context) (*yamux.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return nil, errdefs.FailedPrecondition("sandbox %s: paused to a snapshot", s.m.id)
	}
	// A stopped guest cannot answer: a call would wait out yamux's write
	// timeout and then lose the session. The node resumes before a call.
	if s.paused {
		return nil, errdefs.FailedPrecondition("sandbox %s: paused (its vCPUs are stopped, so its agent cannot answer); resume it first", s.m.id)
	}
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
	err := s.agent.Wait(ctx, s.done, agentclient.Waiting{Attempt: 3 * time.Second, Pause: 50 * time.Millisecond,
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
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess != nil {
		s.sess.Close()
		s.sess = nil
	}
}

// Pause stops the vCPUs at once; the snapshot to disk follows after
// Config.SnapshotAfter (at once when zero).
func (s *sandbox) Pause(ctx context.Context) error {
	if err := s.live(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.paused {
		s.mu.Unlock()
		return nil
	}
	if err := s.b.drv.Pause(ctx, s.m); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("sandbox %s: pause: %w", s.m.id, err)
	}
	s.paused = true
	after := s.b.cfg.SnapshotAfter
	s.timer = qemuvm.SnapshotLater(after, s.b.log, s.m.id, s.Snapshot)
	s.mu.Unlock()
	if after == 0 {
		return s.Snapshot(ctx)
	}
	return nil
}

// Snapshot saves a paused VM's memory and device state to its run dir and
// ends the VMM, so that the sandbox holds no RAM until Resume restores it.
// It is a no-op for a running or already snapshotted sandbox.
func (s *sandbox) Snapshot(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A networked VM stays paused in memory: its QEMU holds the network
	// namespace (with the tap and veth), which would end with the process.
	if !s.paused || s.proc == nil || s.stopped || s.m.Net != nil {
		return nil
	}
	// The restored agent must not expect this session's stream ids.
	if err := s.detachLocked(ctx); err != nil {
		return err
	}
	proc := s.proc
	s.quitProc = proc
	if err := s.b.drv.Snapshot(ctx, s.m); err != nil {
		s.quitProc = nil
		return fmt.Errorf("sandbox %s: snapshot: %w", s.m.id, err)
	}
	select {
	case <-proc.Done():
	case <-ctx.Done():
		return fmt.Errorf("sandbox %s: snapshot: vmm did not exit: %w", s.m.id, ctx.Err())
	}
	proc.Release()
	s.proc = nil
	s.m.Snapshotted, s.m.Pid, s.m.StartTime = true, 0, 0
	return s.m.save()
}

// detachLocked tells the agent to start a fresh session, then drops ours.
// The vCPUs are stopped, so they run for the exchange.
func (s *sandbox) detachLocked(ctx context.Context) error {
	if err := s.b.drv.Resume(ctx, s.m); err != nil {
		return err
	}
	s.paused = false // for the exchange only
	s.mu.Unlock()
	_, err := s.agent.Call(ctx, agentproto.Request{Op: agentproto.OpDetach})
	s.mu.Lock()
	s.paused = true
	if perr := s.b.drv.Pause(ctx, s.m); err == nil {
		err = perr
	}
	if s.sess != nil {
		s.sess.Close()
		s.sess = nil
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: detach agent: %w", s.m.id, err)
	}
	return nil
}

// Resume continues a paused VM, restoring it from its snapshot if it has one.
func (s *sandbox) Resume(ctx context.Context) error {
	if err := s.live(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.paused {
		return nil
	}
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if s.proc != nil {
		if err := s.b.drv.Resume(ctx, s.m); err != nil {
			return fmt.Errorf("sandbox %s: resume: %w", s.m.id, err)
		}
		s.paused = false
		return nil
	}
	proc, err := s.b.restore(ctx, s.m)
	if err != nil {
		return fmt.Errorf("sandbox %s: restore: %w", s.m.id, err)
	}
	s.setProc(proc)
	s.paused = false
	s.mu.Unlock()
	err = s.waitAgent(ctx, time.Minute)
	s.mu.Lock()
	if err != nil {
		return fmt.Errorf("sandbox %s: restore: %w", s.m.id, err)
	}
	return nil
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
	m.Snapshotted = false
	if err := m.save(); err != nil {
		_ = proc.Kill()
		return nil, err
	}
	_ = os.Remove(m.path(snapshotFile))
	return proc, nil
}

// Stop kills the VMM; the run dir stays until Backend.Cleanup.
func (s *sandbox) Stop(ctx context.Context) error {
	s.mu.Lock()
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	s.stopped = true
	proc := s.proc
	s.quitProc = proc
	if s.sess != nil {
		s.sess.Close()
		s.sess = nil
	}
	s.mu.Unlock()
	if proc != nil {
		if err := proc.Kill(); err != nil {
			return fmt.Errorf("sandbox %s: stop: %w", s.m.id, err)
		}
		select {
		case <-proc.Done():
			proc.Release()
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s: stop: %w", s.m.id, ctx.Err())
		}
	}
	if s.m.net != nil {
		if err := s.m.net.Close(); err != nil {
			return fmt.Errorf("sandbox %s: stop: %w", s.m.id, err)
		}
	}
	s.end()
	return nil
}

var _ backend.Networker = (*sandbox)(nil)

// UpdateNetwork implements backend.Networker.
func (s *sandbox) UpdateNetwork(ctx context.Context, n backend.Network) error {
	if s.m.net == nil {
		return errdefs.FailedPrecondition("sandbox %s: created with network mode none: it has no NIC to open (create it with mode allowlist, even with no rules, to change its network later)", s.m.id)
	}
	if err := s.live(); err != nil {
		return err
	}
	mode, err := netpolicy.ParseMode(n.Mode)
	if err != nil {
		return err
	}
	if err := s.m.net.Update(ctx, netpolicy.Policy{Mode: mode, Allow: n.Allow}); err != nil {
		return fmt.Errorf("sandbox %s: %w", s.m.id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.m.net.Record()
	s.m.Net = &rec
	return s.m.save()
}

// NetworkStats implements backend.Networker.
func (s *sandbox) NetworkStats(ctx context.Context) (backend.NetworkStats, error) {
	if s.m.net == nil {
		return backend.NetworkStats{}, nil
	}
	out, err := s.m.net.NetworkStats()
	if err != nil {
		return backend.NetworkStats{}, fmt.Errorf("sandbox %s: %w", s.m.id, err)
	}
	return out, nil
}
