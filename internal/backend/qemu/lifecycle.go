package qemu

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// Lifecycle is the life of one VM sandbox's monitor process (VMM), which
// the microvm and vm backends share: it runs; it is paused (vCPUs
// stopped, RAM still held); after LifecycleConfig.SnapshotAfter its
// memory and device state go to a file and the process ends
// (snapshotted); a resume continues it or starts a new VMM from that
// file; a stop kills it. An exit nobody asked for ends the sandbox
// (Done). Its lock serializes the transitions and the backend's writes
// of the machine record they save (Locked).
type Lifecycle struct {
	id            string
	ops           LifecycleOps
	net           *netpolicy.Sandbox
	snapshotAfter time.Duration
	log           *slog.Logger

	done     chan struct{}
	doneOnce sync.Once

	mu sync.Mutex
	// proc is the VMM; nil while the VM's state is in its snapshot file.
	proc *launch.Process
	// quitProc is the VMM whose exit the sandbox asked for (snapshot,
	// stop): that exit does not end the sandbox.
	quitProc *launch.Process
	paused   bool
	stopped  bool
	timer    *time.Timer // pending snapshot of a paused VM
	reason   string
}

// LifecycleOps is what a backend does to its VM at the transitions.
type LifecycleOps interface {
	// Halt stops the vCPUs; Continue continues them.
	Halt(ctx context.Context) error
	Continue(ctx context.Context) error
	// DetachAgent, before a snapshot and with the vCPUs running for the
	// exchange, has the guest's agent start a fresh session after the
	// restore (it must not expect this session's stream ids), and drops
	// the node's connections to the guest. The lifecycle's lock is held:
	// it must not call back into the Lifecycle.
	DetachAgent(ctx context.Context) error
	// Hibernate saves the halted VM's memory and device state to the run
	// dir's snapshot file; the VMM exits once it is saved. Hibernated
	// then records that no VMM runs.
	Hibernate(ctx context.Context) error
	Hibernated() error
	// Restore starts a VMM from the snapshot file and records it.
	Restore(ctx context.Context) (*launch.Process, error)
	// WaitAgent waits until the guest's agent answers.
	WaitAgent(ctx context.Context, timeout time.Duration) error
	// ExitReason reads why the VM ended on its own (console, VMM log).
	ExitReason() string
	// Disconnect drops the node's connections to the guest: its VMM ended
	// or is being stopped.
	Disconnect()
}

// LifecycleConfig is one sandbox's Lifecycle.
type LifecycleConfig struct {
	ID  string
	Ops LifecycleOps
	// Net is the VM's network slot (nil: no NIC). A networked VM stays
	// paused in memory: its VMM holds the network namespace (with the tap
	// and veth), which would end with the process. Stop closes it.
	Net *netpolicy.Sandbox
	// SnapshotAfter: how long a pause keeps the VM in memory before its
	// snapshot (zero: at once; negative: never).
	SnapshotAfter time.Duration
	Log           *slog.Logger
}

// NewLifecycle watches the running VMM proc, or, when proc is nil, is a
// sandbox whose VM is in its snapshot file (paused).
func NewLifecycle(cfg LifecycleConfig, proc *launch.Process) *Lifecycle {
	l := &Lifecycle{id: cfg.ID, ops: cfg.Ops, net: cfg.Net, snapshotAfter: cfg.SnapshotAfter, log: cfg.Log,
		done: make(chan struct{}), paused: proc == nil}
	if proc != nil {
		l.watch(proc)
	}
	return l
}

// watch installs a VMM process: an exit nobody asked for ends the
// sandbox. l.mu is held, or l is not shared yet.
func (l *Lifecycle) watch(proc *launch.Process) {
	l.proc = proc
	go func() {
		<-proc.Done()
		l.mu.Lock()
		expected := l.quitProc == proc
		if !expected && !l.stopped {
			l.reason = l.ops.ExitReason()
		}
		l.mu.Unlock()
		if !expected {
			l.ops.Disconnect()
			l.end()
		}
	}()
}

func (l *Lifecycle) end() { l.doneOnce.Do(func() { close(l.done) }) }

// Done is closed when the sandbox has ended.
func (l *Lifecycle) Done() <-chan struct{} { return l.done }

// ExitReason is why the VM ended on its own ("" while it runs, or when
// stopped).
func (l *Lifecycle) ExitReason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reason
}

// Running refuses a sandbox that has ended.
func (l *Lifecycle) Running() error {
	select {
	case <-l.done:
		return errdefs.FailedPrecondition("sandbox %s: not running", l.id)
	default:
		return nil
	}
}

// Serving refuses a sandbox whose guest cannot answer: ended, paused
// (its vCPUs are stopped: a call would wait out its timeout) or
// snapshotted.
func (l *Lifecycle) Serving() error {
	if err := l.Running(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.proc == nil:
		return errdefs.FailedPrecondition("sandbox %s: paused to a snapshot on disk: resume it first", l.id)
	case l.paused:
		return errdefs.FailedPrecondition("sandbox %s: paused (its vCPUs are stopped, so its agent cannot answer): resume it first", l.id)
	}
	return nil
}

// Proc is the running VMM (nil while snapshotted).
func (l *Lifecycle) Proc() *launch.Process {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.proc
}

// Checkpointed implements backend.Checkpointer: no VMM runs while the
// VM's state is in its snapshot file.
func (l *Lifecycle) Checkpointed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.proc == nil && !l.stopped
}

// Locked runs f under the lifecycle's lock: for a backend's writes of the
// machine record the transitions save too.
func (l *Lifecycle) Locked(f func() error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return f()
}

// WhileRunning runs f under the lifecycle's lock if the VMM runs and is
// not paused (a live snapshot's steps, which no pause may interleave).
// f's errors come back as they are, so f names the sandbox in them.
func (l *Lifecycle) WhileRunning(f func() error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.paused || l.proc == nil || l.stopped {
		return errdefs.FailedPrecondition("sandbox %s: paused or stopped (resume it first)", l.id)
	}
	if err := f(); err != nil {
		return fmt.Errorf("sandbox %s: %w", l.id, err)
	}
	return nil
}

// Reattach makes the VMM a restarted daemon adopted serve again: a stopped
// VM cannot answer, so it is continued first (the node pauses it again
// when its record says paused), then its agent must answer within
// timeout. On failure the VMM is killed and the error is NotFound (the
// node then cleans the sandbox up).
func (l *Lifecycle) Reattach(ctx context.Context, timeout time.Duration) error {
	err := l.ops.Continue(ctx)
	if err != nil {
		err = fmt.Errorf("vmm does not answer: %w", err)
	} else if err = l.ops.WaitAgent(ctx, timeout); err != nil {
		err = fmt.Errorf("guest agent does not answer: %w", err)
	}
	if err != nil {
		if p := l.Proc(); p != nil {
			_ = p.Kill()
		}
		return errdefs.NotFound("sandbox %s: %v", l.id, err)
	}
	return nil
}

// Pause implements backend.Sandbox: the vCPUs stop at once; the snapshot
// to disk follows after SnapshotAfter (at once when zero).
func (l *Lifecycle) Pause(ctx context.Context) error {
	if err := l.Running(); err != nil {
		return err
	}
	l.mu.Lock()
	if l.paused {
		l.mu.Unlock()
		return nil
	}
	if err := l.ops.Halt(ctx); err != nil {
		l.mu.Unlock()
		return fmt.Errorf("sandbox %s: pause: %w", l.id, err)
	}
	l.paused = true
	if l.snapshotAfter > 0 {
		l.timer = time.AfterFunc(l.snapshotAfter, l.snapshotLater)
	}
	l.mu.Unlock()
	if l.snapshotAfter == 0 {
		return l.Snapshot(ctx)
	}
	return nil
}

// snapshotLater is the timer's snapshot of a VM paused for SnapshotAfter:
// a failure is logged and leaves the VM paused in memory.
func (l *Lifecycle) snapshotLater() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := l.Snapshot(ctx); err != nil {
		l.log.Warn("snapshot of a paused VM failed; it stays paused in memory", "sandbox", l.id, "err", err)
	}
}

// Snapshot saves a paused VM's memory and device state to its run dir and
// ends the VMM, so that the sandbox holds no RAM until Resume restores
// it. It is a no-op unless the VM is paused, in memory and has no NIC.
func (l *Lifecycle) Snapshot(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.paused || l.proc == nil || l.stopped || l.net != nil {
		return nil
	}
	if err := l.detachAgent(ctx); err != nil {
		return fmt.Errorf("sandbox %s: detach agent: %w", l.id, err)
	}
	proc := l.proc
	l.quitProc = proc
	if err := l.ops.Hibernate(ctx); err != nil {
		l.quitProc = nil
		return fmt.Errorf("sandbox %s: snapshot: %w", l.id, err)
	}
	select {
	case <-proc.Done():
	case <-ctx.Done():
		return fmt.Errorf("sandbox %s: snapshot: vmm did not exit: %w", l.id, ctx.Err())
	}
	proc.Release()
	l.proc = nil
	return l.ops.Hibernated()
}

// detachAgent runs the vCPUs of the halted VM for DetachAgent's exchange.
func (l *Lifecycle) detachAgent(ctx context.Context) error {
	if err := l.ops.Continue(ctx); err != nil {
		return err
	}
	err := l.ops.DetachAgent(ctx)
	if herr := l.ops.Halt(ctx); err == nil {
		err = herr
	}
	return err
}

// Resume implements backend.Sandbox: the vCPUs continue, or a new VMM
// restores the snapshot and the guest's agent answers again.
func (l *Lifecycle) Resume(ctx context.Context) error {
	if err := l.Running(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.paused {
		return nil
	}
	l.stopTimer()
	if l.proc != nil {
		if err := l.ops.Continue(ctx); err != nil {
			return fmt.Errorf("sandbox %s: resume: %w", l.id, err)
		}
		l.paused = false
		return nil
	}
	proc, err := l.ops.Restore(ctx)
	if err != nil {
		return fmt.Errorf("sandbox %s: restore: %w", l.id, err)
	}
	l.watch(proc)
	l.paused = false
	// The agent's calls take the lock (Serving).
	l.mu.Unlock()
	err = l.ops.WaitAgent(ctx, time.Minute)
	l.mu.Lock()
	if err != nil {
		return fmt.Errorf("sandbox %s: restore: %w", l.id, err)
	}
	return nil
}

func (l *Lifecycle) stopTimer() {
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
}

// Stop implements backend.Sandbox: the VMM is killed and the network slot
// closed; the run dir stays until the backend's Cleanup.
func (l *Lifecycle) Stop(ctx context.Context) error {
	l.mu.Lock()
	l.stopTimer()
	l.stopped = true
	proc := l.proc
	l.quitProc = proc
	l.mu.Unlock()
	l.ops.Disconnect()
	if proc != nil {
		if err := proc.Kill(); err != nil {
			return fmt.Errorf("sandbox %s: stop: %w", l.id, err)
		}
		select {
		case <-proc.Done():
			proc.Release()
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s: stop: %w", l.id, ctx.Err())
		}
	}
	if l.net != nil {
		if err := l.net.Close(); err != nil {
			return fmt.Errorf("sandbox %s: stop: %w", l.id, err)
		}
	}
	l.end()
	return nil
}

// UpdateNetwork implements backend.Networker; record saves the slot's new
// record in the machine's (under the lifecycle's lock).
func (l *Lifecycle) UpdateNetwork(ctx context.Context, n backend.Network, record func(*netpolicy.Record) error) error {
	if l.net == nil {
		return errdefs.FailedPrecondition("sandbox %s: created with network mode none: it has no NIC to open (create it with mode allowlist, even with no rules, to change its network later)", l.id)
	}
	if err := l.Running(); err != nil {
		return err
	}
	mode, err := netpolicy.ParseMode(n.Mode)
	if err != nil {
		return err
	}
	if err := l.net.Update(ctx, netpolicy.Policy{Mode: mode, Allow: n.Allow}); err != nil {
		return fmt.Errorf("sandbox %s: %w", l.id, err)
	}
	rec := l.net.Record()
	return l.Locked(func() error { return record(&rec) })
}

// NetworkStats implements backend.Networker.
func (l *Lifecycle) NetworkStats(context.Context) (backend.NetworkStats, error) {
	if l.net == nil {
		return backend.NetworkStats{}, nil
	}
	out, err := l.net.NetworkStats()
	if err != nil {
		return backend.NetworkStats{}, fmt.Errorf("sandbox %s: %w", l.id, err)
	}
	return out, nil
}
