package microvm

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// TestGuestPanicEndsOnlyItsSandbox: a kernel panic in one guest ends that
// VM, the sandbox reports it with the reason, and a second VM keeps
// answering.
func TestGuestPanicEndsOnlyItsSandbox(t *testing.T) {
	b := newBackend(t)
	victim := create(t, b, testSpec(t))
	other := create(t, b, testSpec(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, _ = victim.Exec(ctx, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "echo c > /proc/sysrq-trigger"},
		Env: []string{"PATH=/bin"}, Cwd: "/"}, func(backend.Stream, []byte) error { return nil })
	select {
	case <-victim.Done():
	case <-ctx.Done():
		t.Fatal("the panicked guest's sandbox did not end")
	}
	reason := victim.(backend.ExitReasoner).ExitReason()
	if !strings.Contains(reason, "guest kernel panic") {
		t.Errorf("reason %q, want a guest kernel panic", reason)
	}
	if got := sh(t, other, "echo alive"); got != "alive\n" {
		t.Errorf("other sandbox: %q", got)
	}
}

// TestMemoryLimitIsGuestRAM: the guest kernel sees the requested memory as
// its RAM (the conformance suite checks that a memory bomb is OOM-killed
// inside the guest only), and commands run in the agent's commands group,
// whose memory.max keeps the agent's share, also without a pids limit.
func TestMemoryLimitIsGuestRAM(t *testing.T) {
	b := newBackend(t)
	spec := testSpec(t)
	spec.Resources.MemoryBytes = 192 << 20
	spec.Resources.Pids = 0
	sb := create(t, b, spec)
	if got := sh(t, sb, "cat /proc/self/cgroup"); got != "0::/commands\n" {
		t.Errorf("a command's cgroup: %q, want the agent's commands group", got)
	}
	out := sh(t, sb, "awk '/MemTotal/ {print $2}' /proc/meminfo")
	kib, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatal(out, err)
	}
	// The kernel keeps its image and reserved areas (~50 MiB for Debian's)
	// out of MemTotal; the rest is the request, never more.
	if kib > 192<<10 || kib < 128<<10 {
		t.Errorf("guest MemTotal %d KiB, want between 128 and 192 MiB", kib)
	}
	small := testSpec(t)
	small.Resources.MemoryBytes = 64 << 20
	if _, err := b.Create(context.Background(), small); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "memory_bytes") {
		t.Errorf("64 MiB guest: %v; want invalid argument naming memory_bytes", err)
	}
}

// TestPauseResumeSnapshot: a process started before pause keeps running
// after resume, with its files, both for a plain stop/cont and for a
// snapshot to disk (VMM exited, RAM freed) and restore.
func TestPauseResumeSnapshot(t *testing.T) {
	b := newBackend(t, func(c *Config) { c.SnapshotAfter = 0 })
	sb := create(t, b, testSpec(t))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// The counter is replaced by a rename, so a read never sees it half
	// written; the loop has counted once before the pause.
	sh(t, sb, "echo kept > /root/f; (i=0; while true; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/count; sleep 0.2; done) >/dev/null 2>&1 &")
	sh(t, sb, "while [ ! -s /tmp/count ]; do sleep 0.1; done")
	m := sb.(*sandbox).m
	oldPid := m.Pid
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if !m.Snapshotted {
		t.Fatal("pause with SnapshotAfter 0 did not snapshot")
	}
	if _, err := os.Stat(m.path(snapshotFile)); err != nil {
		t.Fatalf("snapshot file: %v", err)
	}
	if err := syscallAlive(oldPid); err == nil {
		t.Errorf("VMM %d still runs after the snapshot", oldPid)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	a := sh(t, sb, "cat /root/f; cat /tmp/count")
	time.Sleep(time.Second)
	c := sh(t, sb, "cat /tmp/count")
	lines := strings.Fields(a)
	if len(lines) != 2 || lines[0] != "kept" {
		t.Fatalf("after restore: %q", a)
	}
	before, _ := strconv.Atoi(lines[1])
	after, _ := strconv.Atoi(strings.TrimSpace(c))
	if after <= before {
		t.Errorf("background loop did not go on after restore: %d then %d", before, after)
	}
	if _, err := os.Stat(m.path(snapshotFile)); !os.IsNotExist(err) {
		t.Errorf("snapshot file left after restore: %v", err)
	}
}

// TestReclaimSnapshots: pause --reclaim of a microVM is its snapshot to
// disk even when the node snapshots paused VMs only later; the memory
// figures say so, and resume restores it.
func TestReclaimSnapshots(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, testSpec(t))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	sh(t, sb, "echo kept > /root/f")
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	before, after, err := sb.(backend.Reclaimer).Reclaim(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if before.ResidentBytes == 0 || after.ResidentBytes != 0 || after.SwappedBytes == 0 || !sb.(*sandbox).m.Snapshotted {
		t.Fatalf("reclaim: before %+v after %+v snapshotted %v", before, after, sb.(*sandbox).m.Snapshotted)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, sb, "cat /root/f"); got != "kept\n" {
		t.Fatalf("after restore: %q", got)
	}
}

// TestAgentRejectsRequestWithoutSecret: the agent serves no stream whose
// request lacks the sandbox's secret.
func TestAgentRejectsRequestWithoutSecret(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, testSpec(t)).(*sandbox)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, secret := range []string{"", strings.Repeat("0", len(sb.m.Secret))} {
		sess, err := sb.session(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st, err := sess.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		fs := agentproto.NewStream(st)
		req := agentproto.Request{Version: agentproto.Version, Secret: secret, Op: agentproto.OpExec,
			Exec: &agentproto.Exec{Argv: []string{"/bin/touch", "/pwned"}}}
		if err := fs.WriteJSON(agentproto.KindRequest, req); err != nil {
			t.Fatal(err)
		}
		var r agentproto.Reply
		if err := fs.ReadJSON(agentproto.KindReply, &r); err != nil {
			t.Fatal(err)
		}
		st.Close()
		if !errdefs.IsPermissionDenied(r.Err()) {
			t.Errorf("secret %q: reply %+v, want permission denied", secret, r)
		}
	}
	if _, err := sb.Stat(ctx, "/pwned"); !errdefs.IsNotFound(err) {
		t.Errorf("/pwned: %v; the refused command must not have run", err)
	}
}

func syscallAlive(pid int) error {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err
}
