package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/guest/agentproto"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// sandbox implements backend.Sandbox for one VM; QEMU's pause, snapshot,
// restore and stop are the shared qemuvm.Lifecycle's.
type sandbox struct {
	*qemuvm.Lifecycle
	b   *Backend
	m   *machine
	qga *qga
	// agent is corral-agent when the image has it (nil: qemu-ga serves
	// exec and files).
	agent   *agentConn
	oomSeen atomic.Int64 // the guest's OOM kills counted so far
}

var (
	_ backend.Sandbox      = (*sandbox)(nil)
	_ backend.ExitReasoner = (*sandbox)(nil)
	_ backend.Checkpointer = (*sandbox)(nil)
	_ backend.Networker    = (*sandbox)(nil)
)

// newSandbox is the sandbox of a running QEMU, or of a VM in its snapshot
// file when proc is nil.
func (b *Backend) newSandbox(m *machine, proc *launch.Process) *sandbox {
	s := &sandbox{b: b, m: m, qga: &qga{path: m.path(qgaSock)}, agent: agentFor(m)}
	s.Lifecycle = qemuvm.NewLifecycle(qemuvm.LifecycleConfig{ID: m.id, Ops: lifecycleOps{s}, Net: m.net,
		SnapshotAfter: b.cfg.SnapshotAfter, Log: b.log}, proc)
	return s
}

func (s *sandbox) ID() string { return s.m.id }

// Record implements backend.Sandbox: everything lives in the run dir.
func (s *sandbox) Record() []byte {
	b, _ := json.Marshal(map[string]string{"image": s.m.Image})
	return b
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
		case <-s.Done():
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
		case <-s.Done():
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
			s.oomSeen.Store(n)
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

// UpdateNetwork implements backend.Networker.
func (s *sandbox) UpdateNetwork(ctx context.Context, n backend.Network) error {
	return s.Lifecycle.UpdateNetwork(ctx, n, func(rec *netpolicy.Record) error {
		s.m.Net = rec
		return s.m.save()
	})
}

// Stats implements backend.StatsReader from the host side: QEMU's CPU
// time and resident memory (what the VM costs the node) and the blocks
// its overlay holds.
func (s *sandbox) Stats(_ context.Context) (backend.Stats, error) {
	return qemuvm.Stats(s.m.id, s.m.path(overlayFile), s.Proc())
}

// lifecycleOps drives QEMU over QMP for qemuvm.Lifecycle.
type lifecycleOps struct{ s *sandbox }

func (o lifecycleOps) Halt(ctx context.Context) error {
	_, err := qmpRun(ctx, o.s.m, "stop", nil)
	return err
}

func (o lifecycleOps) Continue(ctx context.Context) error {
	_, err := qmpRun(ctx, o.s.m, "cont", nil)
	return err
}

// Hibernate: the disk needs nothing, the overlay is consistent once QEMU
// stopped.
func (o lifecycleOps) Hibernate(ctx context.Context) error { return saveState(ctx, o.s.m) }

func (o lifecycleOps) Hibernated() error {
	o.s.m.Hibernated()
	return o.s.m.save()
}

func (o lifecycleOps) Restore(ctx context.Context) (*launch.Process, error) {
	return o.s.b.restoreQEMU(ctx, o.s.m)
}

func (o lifecycleOps) WaitAgent(ctx context.Context, timeout time.Duration) error {
	return o.s.waitAgent(ctx, timeout)
}

func (o lifecycleOps) Disconnect() {
	o.s.qga.close()
	o.s.agent.close()
}

// DetachAgent has corral-agent start a fresh session after the restore;
// qemu-ga keeps no session.
func (o lifecycleOps) DetachAgent(ctx context.Context) error {
	o.s.qga.close()
	if o.s.agent == nil {
		return nil
	}
	_, err := o.s.agent.Call(ctx, agentproto.Request{Op: agentproto.OpDetach})
	o.s.agent.close()
	return err
}

// ExitReason reads why the VM ended from its serial console and QEMU's
// log (a guest that powers off, reboots or panics ends QEMU).
func (o lifecycleOps) ExitReason() string {
	m := o.s.m
	console := qemuvm.TailFile(m.path(consoleFile), 8192)
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
	if log := qemuvm.TailFile(m.path(logFile), 300); log != "" {
		return "qemu exited: " + log
	}
	return "qemu exited"
}
