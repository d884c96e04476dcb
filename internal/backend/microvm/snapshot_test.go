package microvm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// TestSnapshotRestoreIdentity shares one networked guest on a lab
// internet: a call to it while paused fails at once (and leaves its
// session usable); a snapshot while it runs restores into a sandbox whose
// agent took a new secret (and refuses the snapshot's) and whose eth0 took
// its new slot's MAC and addresses, through which the allowed host
// answers; a restore with other resources is refused before anything is
// made.
func TestSnapshotRestoreIdentity(t *testing.T) {
	_, cfg := newLab(t)
	b := newBackend(t, func(c *Config) { c.Network = newManager(t, cfg) })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	spec := testSpec(t)
	spec.Network = backend.Network{Mode: "allowlist", Allow: []string{"pypi"}}
	sb := create(t, b, spec)
	sh(t, sb, "echo before > /tmp/mark")

	t.Run("CallWhilePausedFailsFast", func(t *testing.T) {
		if err := sb.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := sb.Stat(cctx, "/tmp/mark")
		ccancel()
		if !errdefs.IsFailedPrecondition(err) {
			t.Errorf("stat of a paused guest: %v, want failed precondition at once", err)
		}
		if _, err := sb.(*sandbox).SnapshotTo(ctx, t.TempDir()); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("snapshot of a paused guest: %v, want failed precondition", err)
		}
		if err := sb.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if got := sh(t, sb, "cat /tmp/mark"); got != "before\n" {
			t.Errorf("after resume: %q", got)
		}
	})

	dir := t.TempDir()
	if _, err := sb.(*sandbox).SnapshotTo(ctx, dir); err != nil {
		t.Fatal(err)
	}
	// A booted guest's RAM (a memfd) is copied beside the stream, which
	// then holds only the device state.
	ram, err1 := os.Stat(filepath.Join(dir, qemuvm.SnapRAMFile))
	mem, err2 := os.Stat(filepath.Join(dir, snapMemFile))
	if err1 != nil || err2 != nil || ram.Size() != 256<<20 || mem.Size() > 16<<20 {
		t.Errorf("snapshot files: ram %v %v, stream %v %v; want a 256 MiB RAM image and a small stream", ram, err1, mem, err2)
	}
	sh(t, sb, "echo after > /tmp/mark")

	t.Run("RestoreRefusesOtherResources", func(t *testing.T) {
		spec := testSpec(t)
		spec.Resources.MemoryBytes = 512 << 20
		if _, err := b.Restore(ctx, spec, dir); !errdefs.IsInvalidArgument(err) {
			t.Errorf("restore with other memory: %v, want invalid argument", err)
		}
		if _, err := os.Stat(b.runDir(spec.ID)); !os.IsNotExist(err) {
			t.Errorf("refused restore left its run dir: %v", err)
		}
	})

	t.Run("FreshIdentity", func(t *testing.T) {
		spec := testSpec(t)
		spec.Network = backend.Network{Mode: "allowlist", Allow: []string{"pypi"}}
		r := restore(ctx, t, b, spec, dir)
		if got := sh(t, r, "cat /tmp/mark; hostname"); got != "before\nsandbox\n" {
			t.Errorf("restored guest: %q, want the snapshot's file", got)
		}
		rs, old := r.(*sandbox), sb.(*sandbox).m.Secret
		if rs.m.Secret == old {
			t.Fatal("the restored sandbox kept the snapshot's secret")
		}
		fresh := rs.m.Secret
		rs.m.Secret = old
		_, err := rs.agent.Call(ctx, agentproto.Request{Op: agentproto.OpPing})
		rs.m.Secret = fresh
		if !errdefs.IsPermissionDenied(err) {
			t.Errorf("the snapshot's secret on the restored agent: %v, want permission denied", err)
		}
		src := sb.(*sandbox).m
		if rs.m.MAC == src.MAC || rs.m.Net.Addr4 == src.Net.Addr4 || rs.m.Net.HostVeth == src.Net.HostVeth {
			t.Errorf("restored network slot %+v (MAC %s) is the source's %+v (MAC %s)", rs.m.Net, rs.m.MAC, src.Net, src.MAC)
		}
		const probe = `cat /sys/class/net/eth0/address; ip -4 -o addr show dev eth0 | awk '{print $4}'
nslookup pypi.test >/dev/null; printf 'GET / HTTP/1.0\r\n\r\n' | timeout 20 nc 198.18.1.10 80 | tail -n1`
		got := sh(t, r, probe)
		if !strings.Contains(got, rs.m.MAC+"\n"+rs.m.Net.Addr4+"/") || !strings.Contains(got, "lab host 198.18.1.10") {
			t.Errorf("restored guest's network: %q, want MAC %s, address %s and the lab host's answer", got, rs.m.MAC, rs.m.Net.Addr4)
		}
		if got := sh(t, sb, probe); !strings.Contains(got, src.MAC+"\n"+src.Net.Addr4+"/") || !strings.Contains(got, "lab host 198.18.1.10") {
			t.Errorf("the original's network after the restore: %q", got)
		}
		if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", rs.m.Pid)); !strings.Contains(string(cmd), "mem-path="+filepath.Join(dir, qemuvm.SnapRAMFile)) {
			t.Errorf("restored VMM does not map the RAM image: %q", cmd)
		}
		// The copy's RAM is a private file mapping, not a memfd: its own
		// snapshot streams the RAM, and restores as well.
		dir2 := t.TempDir()
		if _, err := rs.SnapshotTo(ctx, dir2); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dir2, qemuvm.SnapRAMFile)); !os.IsNotExist(err) {
			t.Errorf("snapshot of a restored guest wrote a RAM image: %v", err)
		}
		spec2 := testSpec(t)
		spec2.Network = spec.Network
		r2 := restore(ctx, t, b, spec2, dir2)
		if got := sh(t, r2, "cat /tmp/mark"); got != "before\n" {
			t.Errorf("second-generation restore: %q", got)
		}
		if _, err := os.Stat(filepath.Join(b.runDir(spec.ID), diskFile)); err != nil {
			t.Errorf("restored sandbox has no disk of its own: %v", err)
		}
		if got := sh(t, sb, "cat /tmp/mark"); got != "after\n" {
			t.Errorf("the original after the restore: %q", got)
		}
	})

	// The snapshot's guest had the source's pids limit (256): a restore
	// with another has the restored agent hold its commands to that one.
	t.Run("RestoreTakesItsPidsLimit", func(t *testing.T) {
		const limit = 16
		spec := testSpec(t)
		spec.Network = backend.Network{Mode: "allowlist", Allow: []string{"pypi"}}
		spec.Resources.Pids = limit
		r := restore(ctx, t, b, spec, dir)
		got := sh(t, r, "(i=0; while [ $i -lt 100 ]; do sleep 1000 & echo $! >> /tmp/sleepers; i=$((i+1)); echo $i > /tmp/forks; done) 2>/dev/null;"+
			" read n < /tmp/forks; echo $n; while read p; do kill -9 $p; done < /tmp/sleepers")
		if n, err := strconv.Atoi(strings.TrimSpace(got)); err != nil || n > limit {
			t.Errorf("restored guest forked %q sleepers under a pids limit of %d", got, limit)
		}
	})
}

// restore restores the snapshot in dir as spec, stopped and cleaned up
// when the test ends.
func restore(ctx context.Context, t *testing.T, b *Backend, spec backend.Spec, dir string) backend.Sandbox {
	t.Helper()
	r, err := b.Restore(ctx, spec, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.Stop(context.Background())
		_ = b.Cleanup(context.Background(), spec.ID, nil)
	})
	return r
}
