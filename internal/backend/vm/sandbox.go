package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// sandbox implements backend.Sandbox for one VM.
type sandbox struct {
	b   *Backend
	m   *machine
	qga *qga
	// agent is corral-agent when the image has it (nil: qemu-ga serves
	// exec and files).
	agent *agentConn

	done     chan struct{}
	doneOnce sync.Once

	mu sync.Mutex
	// proc is QEMU; nil while the VM's state is in its snapshot file.
	proc    *launch.Process
	paused  bool
	stopped bool
	reason  string
	// quitProc is the QEMU whose exit the sandbox asked for (snapshot,
	// stop): that exit does not end the sandbox.
	quitProc *launch.Process
	timer    *time.Timer // pending snapshot of a paused VM
	oomSeen  int64       // the guest's OOM kills counted so far
}

func (b *Backend) newSandbox(m *machine, proc *launch.Process) *sandbox {
	s := &sandbox{b: b, m: m, qga: &qga{path: m.path(qgaSock)}, agent: agentFor(m), done: make(chan struct{})}
	s.setProc(proc)
	return s
}

// newSnapshotted is a sandbox whose VM is in its snapshot file.
func (b *Backend) newSnapshotted(m *machine) *sandbox {
	return &sandbox{b: b, m: m, qga: &qga{path: m.path(qgaSock)}, agent: agentFor(m), done: make(chan struct{}), paused: true}
}

// setProc installs a QEMU process and watches it: an exit nobody asked
// for ends the sandbox.
func (s *sandbox) setProc(proc *launch.Process) {
	s.proc = proc
	go func() {
		<-proc.Done()
		s.mu.Lock()
		expected := s.quitProc == proc
		if !expected && !s.stopped {
			s.reason = s.exitReason()
		}
		s.mu.Unlock()
		if !expected {
			s.qga.close()
			s.agent.close()
			s.end()
		}
	}()
}

func (s *sandbox) end() { s.doneOnce.Do(func() { close(s.done) }) }

// exitReason reads why the VM ended from its serial console and QEMU's
// log (a guest that powers off, reboots or panics ends QEMU).
func (s *sandbox) exitReason() string {
	console := qemuvm.TailFile(s.m.path(consoleFile), 8192)
	switch {
	case strings.Contains(console, "Kernel panic"):
		i := strings.Index(console, "Kernel panic")
		line, _, _ := strings.Cut(console[i:], "\n")
		return "guest kernel panic: " + strings.TrimSpace(line)
	case strings.Contains(console, "reboot: Power down"):
		return "guest shut down"
	case strings.Contains(console, "reboot: Restarting system"):
		return "guest rebooted (a vm sandbox ends when its guest reboots)"
	}
	if log := qemuvm.TailFile(s.m.path(logFile), 300); log != "" {
		return "qemu exited: " + log
	}
	return "qemu exited"
}

func (s *sandbox) ID() string            { return s.m.id }
func (s *sandbox) Done() <-chan struct{} { return s.done }

// Record implements backend.Sandbox: everything lives in the run dir.
func (s *sandbox) Record() []byte {
	b, _ := json.Marshal(map[string]string{"image": s.m.Image})
	return b
}

// ExitReason implements backend.ExitReasoner.
func (s *sandbox) ExitReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reason
}

// running refuses a sandbox whose QEMU has ended.
func (s *sandbox) running() error {
	select {
	case <-s.done:
		return errdefs.FailedPrecondition("sandbox %s: not running", s.m.id)
	default:
		return nil
	}
}

// live refuses a sandbox that has ended or is paused (its agents cannot
// answer).
func (s *sandbox) live() error {
	if err := s.running(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused {
		// A stopped guest cannot answer its agent.
		return errdefs.FailedPrecondition("sandbox %s: paused", s.m.id)
	}
	return nil
}

// waitAgent pings the guest agent until it answers, QEMU exits or
// timeout; then it asks which OS the guest runs.
func (s *sandbox) waitAgent(ctx context.Context, timeout time.Duration) error {
	if s.agent != nil {
		return s.waitCorralAgent(ctx, timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	for wait := 2 * time.Second; ; wait = min(2*wait, 30*time.Second) {
		err := s.qga.ping(ctx, wait)
		if err == nil {
			break
		}
		select {
		case <-s.done:
			return fmt.Errorf("guest ended before its agent answered: %s", s.ExitReason())
		default:
		}
		if ctx.Err() != nil {
			return fmt.Errorf("guest agent not ready after %v: %w (console: %s)", timeout, err, qemuvm.TailFile(s.m.path(consoleFile), 400))
		}
		time.Sleep(200 * time.Millisecond)
	}
	var info struct {
		ID string `json:"id"`
	}
	if err := s.qga.call(ctx, "guest-get-osinfo", nil, &info); err != nil {
		return fmt.Errorf("guest-get-osinfo: %w", err)
	}
	s.m.OS = info.ID
	if info.ID != "mswindows" {
		// osinfo names the distribution, not the kernel: ask uname (from
		// the agent's PATH) whether the wrappers of a Linux guest apply.
		var out strings.Builder
		res, err := s.Exec(ctx, backend.ExecSpec{Argv: []string{"uname", "-s"}, Timeout: time.Minute},
			func(st backend.Stream, p []byte) error {
				if st == backend.Stdout {
					out.Write(p)
				}
				return nil
			})
		s.m.Linux = err == nil && res.ExitCode == 0 && strings.TrimSpace(out.String()) == "Linux"
	}
	if s.m.Linux {
		if n, err := s.oomKills(ctx); err == nil {
			s.mu.Lock()
			s.oomSeen = n
			s.mu.Unlock()
		}
	}
	return s.m.save()
}

// setupGuest names the guest and, when networked, gives its NIC the
// slot's addresses (Linux guests; others configure themselves, e.g. by
// DHCP from their own image). The agent can answer before udev has
// renamed the NIC (eth0 to enp…): setup waits for udev and looks again.
func (s *sandbox) setupGuest(ctx context.Context, hostname string) error {
	if !s.m.Linux {
		return nil
	}
	script := `[ -n "$1" ] && hostname "$1"`
	args := []string{hostname}
	if s.m.net != nil {
		g := s.m.net.Guest()
		script += `
command -v udevadm >/dev/null && udevadm settle --timeout=30
for try in 1 2 3 4 5 6 7 8 9 10; do
for i in /sys/class/net/*; do [ "$(cat $i/address 2>/dev/null)" = "$2" ] && dev=${i##*/}; done
[ -n "$dev" ] && [ -e "/sys/class/net/$dev" ] && break; dev=; sleep 1
done
[ -n "$dev" ] || { echo "no NIC with MAC $2" >&2; exit 1; }
ip link set dev "$dev" up && ip addr add "$3" dev "$dev" && ip route add default via "$4" &&
ip -6 addr add "$5" dev "$dev" nodad && ip -6 route add default via "$6" &&
echo "nameserver $7" > /etc/resolv.conf`
		args = append(args, s.m.MAC, g.Addr4.String(), g.Gateway4.String(), g.Addr6.String(), g.Gateway6.String(),
			s.m.net.Resolver().String())
	}
	if _, err := s.sh(ctx, script, args...); err != nil {
		return fmt.Errorf("guest setup: %w", err)
	}
	if s.agent != nil {
		return nil // commands run under corral-agent, not qemu-ga
	}
	// systemd stops a service one of whose processes the OOM killer took
	// (OOMPolicy=stop): qemu-ga would restart and forget every running
	// command, so a memory bomb in one command would lose the others. Last,
	// as the reload must not race the NIC's setup; in the background, as
	// a reload of a loaded TCG guest can take longer than a guest command
	// may (its output to /dev/null, so qemu-ga need not wait for it).
	if _, err := s.sh(ctx, `[ -d /run/systemd/system ] || exit 0
d=/run/systemd/system/qemu-guest-agent.service.d
mkdir -p "$d" && printf '[Service]\nOOMPolicy=continue\n' > "$d/corral-oom.conf" || exit 1
systemctl daemon-reload </dev/null >/dev/null 2>&1 &`); err != nil {
		return fmt.Errorf("guest setup: agent oom policy: %w", err)
	}
	return nil
}

// Pause implements backend.Sandbox: QMP stop halts the vCPUs (and the
// guest's clocks); memory stays allocated until Config.SnapshotAfter has
// passed (at once when zero), when the VM's state goes to a file and QEMU
// exits.
func (s *sandbox) Pause(ctx context.Context) error {
	if err := s.running(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.paused {
		s.mu.Unlock()
		return nil
	}
	if _, err := qmpRun(ctx, s.m, "stop", nil); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("sandbox %s: stop: %w", s.m.id, err)
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
// ends QEMU; the disk needs nothing (the overlay is consistent once QEMU
// stopped). A networked VM stays in memory: its QEMU holds the network
// namespace. It is a no-op unless the VM is paused and in memory.
func (s *sandbox) Snapshot(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.paused || s.proc == nil || s.stopped || s.m.Net != nil {
		return nil
	}
	s.qga.close()
	if err := s.detachAgentLocked(ctx); err != nil {
		return err
	}
	proc := s.proc
	s.quitProc = proc
	if err := saveState(ctx, s.m); err != nil {
		s.quitProc = nil
		return fmt.Errorf("sandbox %s: snapshot: %w", s.m.id, err)
	}
	select {
	case <-proc.Done():
	case <-ctx.Done():
		return fmt.Errorf("sandbox %s: snapshot: qemu did not exit: %w", s.m.id, ctx.Err())
	}
	proc.Release()
	s.proc = nil
	s.m.Snapshotted, s.m.Pid, s.m.StartTime = true, 0, 0
	return s.m.save()
}

// Checkpointed implements backend.Checkpointer.
func (s *sandbox) Checkpointed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc == nil && !s.stopped
}

// Resume implements backend.Sandbox: QMP cont, or a new QEMU restoring
// the snapshot, then the guest agent again.
func (s *sandbox) Resume(ctx context.Context) error {
	if err := s.running(); err != nil {
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
		if _, err := qmpRun(ctx, s.m, "cont", nil); err != nil {
			return fmt.Errorf("sandbox %s: cont: %w", s.m.id, err)
		}
		s.paused = false
		return nil
	}
	proc, err := s.b.restoreQEMU(ctx, s.m)
	if err != nil {
		return fmt.Errorf("sandbox %s: restore: %w", s.m.id, err)
	}
	s.setProc(proc)
	s.paused = false
	s.m.Snapshotted = false
	if err := s.m.save(); err != nil {
		return err
	}
	_ = os.Remove(s.m.path(snapshotFile))
	s.mu.Unlock()
	err = s.waitAgent(ctx, time.Minute)
	s.mu.Lock()
	if err != nil {
		return fmt.Errorf("sandbox %s: restore: %w", s.m.id, err)
	}
	return nil
}

// Stop kills QEMU; the run dir stays until Backend.Cleanup.
func (s *sandbox) Stop(ctx context.Context) error {
	s.mu.Lock()
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	s.stopped = true
	proc := s.proc
	s.quitProc = proc
	s.mu.Unlock()
	s.qga.close()
	s.agent.close()
	if proc != nil {
		if err := proc.Kill(); err != nil {
			return fmt.Errorf("sandbox %s: stop: %w", s.m.id, err)
		}
		select {
		case <-proc.Done():
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

// UpdateNetwork implements backend.Networker.
func (s *sandbox) UpdateNetwork(ctx context.Context, n backend.Network) error {
	if s.m.net == nil {
		return errdefs.FailedPrecondition("sandbox %s: created with network mode none: it has no NIC to open (create it with mode allowlist, even with no rules, to change its network later)", s.m.id)
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
	return s.m.net.NetworkStats()
}

// Stats implements backend.StatsReader from the host side: QEMU's CPU
// time and resident memory (what the VM costs the node) and the blocks
// its overlay holds.
func (s *sandbox) Stats(_ context.Context) (backend.Stats, error) {
	s.mu.Lock()
	proc := s.proc
	s.mu.Unlock()
	return qemuvm.Stats(s.m.id, s.m.path(overlayFile), proc)
}
