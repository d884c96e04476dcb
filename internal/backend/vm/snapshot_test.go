package vm

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// TestVMSnapshotRestore snapshots the shared (networked) VM while a
// counter runs in it and restores the snapshot into a new sandbox (a
// restore boots nothing): the counter runs on from at least its value at
// the snapshot, a file written before it is there, and the copy has its
// own id, hostname, agent secret (the snapshot's is refused), NIC address
// and working network, while the source runs on unchanged.
func TestVMSnapshotRestore(t *testing.T) {
	b, sb := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	pid := strings.TrimSpace(sh(t, sb, `setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/snapc; sleep 0.1; done' </dev/null >/dev/null 2>&1 & echo $!
echo before-snapshot > /root/snapmark; until [ -s /tmp/snapc ]; do sleep 0.1; done`))
	defer sh(t, sb, "kill "+pid)
	at, err := strconv.Atoi(strings.TrimSpace(sh(t, sb, "cat /tmp/snapc")))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	start := time.Now()
	n, err := sb.SnapshotTo(ctx, dir)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	t.Logf("snapshot of a running vm: %v, %d MiB on disk", time.Since(start).Round(time.Millisecond), n>>20)
	if _, err := os.Stat(filepath.Join(dir, qemuvm.SnapRAMFile)); err != nil {
		t.Errorf("a booted VM's snapshot has no RAM image: %v", err)
	}
	if out := sh(t, sb, "hostname; cat /root/snapmark"); out != "sandbox\nbefore-snapshot\n" {
		t.Errorf("source after the snapshot: %q", out)
	}

	spec := shared.spec
	spec.ID, spec.Hostname = testSpec().ID, "restored"
	start = time.Now()
	r, err := b.Restore(ctx, spec, dir)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	t.Logf("restore into a new sandbox: %v", time.Since(start).Round(time.Millisecond))
	rs := r.(*sandbox)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		if err := rs.Stop(cctx); err != nil {
			t.Errorf("stop restored: %v", err)
		}
		if err := b.Cleanup(cctx, spec.ID, nil); err != nil {
			t.Errorf("cleanup restored: %v", err)
		}
		if l := leftovers(t, b, spec.ID); len(l) > 0 {
			t.Errorf("restored sandbox left %v", l)
		}
	})
	if rs.ID() != spec.ID || rs.m.Secret == sb.m.Secret || rs.m.MAC == sb.m.MAC {
		t.Errorf("restored id %q secret-changed %v mac %s (source %s): want a new identity", rs.ID(), rs.m.Secret != sb.m.Secret, rs.m.MAC, sb.m.MAC)
	}
	if out := sh(t, rs, "hostname; cat /root/snapmark"); out != "restored\nbefore-snapshot\n" {
		t.Errorf("restored hostname and file: %q", out)
	}
	first, err := strconv.Atoi(strings.TrimSpace(sh(t, rs, "cat /tmp/snapc")))
	if err != nil || first < at {
		t.Errorf("restored counter %d (%v); want at least %d, its value before the snapshot", first, err, at)
	}
	if got := strings.TrimSpace(sh(t, rs, "sleep 1; kill -0 "+pid+" && cat /tmp/snapc")); got == strconv.Itoa(first) {
		t.Errorf("restored counter stays at %s: its process did not come along", got)
	}

	// The snapshot's secret opens no session to the restored agent.
	rs.agent.close()
	old := newAgentConn(rs.m.path(agentSock), sb.m.Secret, rs.m.PortHandshake)
	_, err = old.Call(ctx, agentproto.Request{Op: agentproto.OpPing})
	old.close()
	if !errdefs.IsPermissionDenied(err) {
		t.Errorf("restored agent, ping with the snapshot's secret: %v; want permission denied", err)
	}

	// The NIC moved to the new slot, and the allowlist holds there.
	g := rs.m.net.Guest()
	out := sh(t, rs, `cat /sys/class/net/*/address; ip -4 -o addr show; python3 - <<'EOF'
import socket
# The allowlist opens the addresses its names resolve to.
print("dns", socket.gethostbyname("pypi.test"))
for addr in ("198.18.1.10", "198.18.1.30"):
    try:
        socket.create_connection((addr, 80), timeout=6).close()
        print(addr, "reached")
    except OSError:
        print(addr, "unreachable")
EOF`)
	for _, want := range []string{rs.m.MAC, g.Addr4.String(), "dns 198.18.1.10", "198.18.1.10 reached", "198.18.1.30 unreachable"} {
		if !strings.Contains(out, want) {
			t.Errorf("restored guest's network lacks %q:\n%s", want, out)
		}
	}

	if strings.Contains(out, sb.m.MAC) {
		t.Errorf("restored guest kept the snapshot's MAC %s:\n%s", sb.m.MAC, out)
	}
	if out := sh(t, sb, "hostname; kill -0 "+pid+" && echo alive"); out != "sandbox\nalive\n" {
		t.Errorf("source after the restore: %q", out)
	}
}
