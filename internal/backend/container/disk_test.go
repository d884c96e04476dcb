package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/storage/upper/loopdev"
)

const mib = 1 << 20

// fileSize runs stat -c %s in the sandbox.
func fileSize(t *testing.T, s backend.Sandbox, path string) int64 {
	t.Helper()
	r := sh(t, s, "stat -c %s "+path)
	n, err := strconv.ParseInt(strings.TrimSpace(r.stdout), 10, 64)
	if err != nil {
		t.Fatalf("stat %s: %q %q", path, r.stdout, r.stderr)
	}
	return n
}

// assertDiskGone checks that the sandbox's image is deleted and no loop
// device is bound to it, on top of assertGone.
func assertDiskGone(t *testing.T, b *Backend, id string, pid int) {
	t.Helper()
	assertGone(t, b, id, pid)
	for _, l := range diskLeftovers(id) {
		t.Errorf("%s: %s", id, l)
	}
}

// diskLeftovers lists what of sandbox id's ext4 image remains: the image
// or a loop device bound to it.
func diskLeftovers(id string) []string {
	var out []string
	img := filepath.Join(diskDir(), id+".img")
	if _, err := os.Lstat(img); !os.IsNotExist(err) {
		out = append(out, "image remains")
	}
	if devs, _ := loopdev.Holders(img); len(devs) > 0 {
		out = append(out, fmt.Sprintf("loop devices still bound to its image: %v", devs))
	}
	return out
}

func TestDiskFullENOSPC(t *testing.T) {
	b := newDiskBackend(t)
	full := newSandbox(t, b, withDisk(16*mib, 4096))
	other := newSandbox(t, b, withDisk(16*mib, 4096))
	r := sh(t, full, "dd if=/dev/zero of=/fill bs=1M 2>&1; echo rc=$?")
	if !strings.Contains(r.stdout, "No space left on device") || strings.Contains(r.stdout, "rc=0") {
		t.Fatalf("dd on a full disk: %q", r.stdout)
	}
	if n := fileSize(t, full, "/fill"); n < 15*mib || n > 16*mib+256<<10 {
		t.Fatalf("filled %d bytes, want about %d", n, 16*mib)
	}
	if r := sh(t, full, "yes 2>&1 >/more; echo rc=$?"); !strings.Contains(r.stdout, "No space left on device") {
		t.Fatalf("yes on a full disk: %q", r.stdout)
	}
	if r := sh(t, other, "dd if=/dev/zero of=/f bs=1M count=8 2>/dev/null && echo ok"); r.stdout != "ok\n" {
		t.Fatalf("second sandbox cannot write: %+v", r)
	}
	// Space comes back when the agent deletes.
	if r := sh(t, full, "rm /fill /more && dd if=/dev/zero of=/again bs=1M count=8 2>/dev/null && echo ok"); r.stdout != "ok\n" {
		t.Fatalf("no space after rm: %+v", r)
	}
}

func TestDiskInodeLimit(t *testing.T) {
	b := newDiskBackend(t)
	const limit = 500
	s := newSandbox(t, b, withDisk(16*mib, limit))
	r := sh(t, s, "mkdir /d; i=0; while true > /d/f$i; do i=$((i+1)); done; echo $i")
	n, err := strconv.Atoi(strings.TrimSpace(r.stdout))
	if err != nil || n < limit-10 || n > limit+64 {
		t.Fatalf("created %q files, want about %d: %+v", r.stdout, limit, r)
	}
	if !strings.Contains(r.stderr, "No space left on device") {
		t.Fatalf("want ENOSPC: %q", r.stderr)
	}
}

func TestDiskCopyUpCharged(t *testing.T) {
	b := newDiskBackend(t)
	layer := t.TempDir()
	for _, name := range []string{"big1", "big2"} {
		if err := os.WriteFile(filepath.Join(layer, name), make([]byte, 10*mib), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := newSandbox(t, b, func(sp *backend.Spec) {
		sp.Layers = []string{layer, layerDir}
		withDisk(16*mib, 4096)(sp)
	})
	if r := sh(t, s, "echo x >> /big1 && echo ok"); r.stdout != "ok\n" {
		t.Fatalf("copy-up of 10 MiB into a 16 MiB disk: %+v", r)
	}
	// The copy-up took 10 MiB: another 10 MiB file cannot be copied up.
	r := sh(t, s, "echo x >> /big2")
	if r.ExitCode == 0 || !strings.Contains(r.stderr, "No space left on device") {
		t.Fatalf("second copy-up: %+v", r)
	}
	if r := sh(t, s, "cat /big2 | wc -c"); strings.TrimSpace(r.stdout) != strconv.Itoa(10*mib) {
		t.Fatalf("lower file damaged by the failed copy-up: %q", r.stdout)
	}
}

func TestDiskCleanupLeavesNothing(t *testing.T) {
	b := newDiskBackend(t)
	spec := defaultSpec(newID(t))
	withDisk(8*mib, 1000)(&spec)
	ctx := context.Background()
	s := createBare(t, b, spec)
	pid := s.(*sandbox).proc.Pid
	sh(t, s, "sleep 1000 >/dev/null 2>&1 & echo x > /tmp/f")
	// The node mounted the disk detached: only the sandbox's overlay
	// holds it, through the loop device.
	if devs, _ := loopdev.Holders(filepath.Join(diskDir(), spec.ID+".img")); len(devs) != 1 {
		t.Fatalf("loop devices of the running sandbox's disk: %v, want one", devs)
	}
	if hm, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(hm), spec.ID) {
		t.Fatal("sandbox disk mount visible on the host")
	}
	if r := sh(t, s, "df -k / | tail -1"); !strings.Contains(r.stdout, "overlay") {
		t.Fatalf("df: %q", r.stdout)
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Cleanup(ctx, spec.ID, s.Record()); err != nil {
		t.Fatal(err)
	}
	assertDiskGone(t, b, spec.ID, pid)
}

func TestDiskCreateFailureAtEachStep(t *testing.T) {
	b := newDiskBackend(t)
	defer func() { failStep = "" }()
	for _, st := range createSteps {
		failStep = st.Name
		spec := defaultSpec(newID(t))
		withDisk(4*mib, 100)(&spec)
		if _, err := b.Create(context.Background(), spec); err == nil || !strings.Contains(err.Error(), st.Name) {
			t.Fatalf("step %s: want injected failure, got %v", st.Name, err)
		}
		assertDiskGone(t, b, spec.ID, 0)
	}
	failStep = ""
	spec := defaultSpec(newID(t))
	withDisk(4*mib, 100)(&spec)
	spec.Layers = []string{"/nonexistent-layer"} // fails after init started
	if _, err := b.Create(context.Background(), spec); err == nil || !strings.Contains(err.Error(), "layer: idmap /nonexistent-layer") {
		t.Fatalf("bad layer: %v", err)
	}
	assertDiskGone(t, b, spec.ID, 0)
}

func TestDiskRecoverAfterRestart(t *testing.T) {
	b := newDiskBackend(t)
	spec := defaultSpec(newID(t))
	withDisk(8*mib, 1000)(&spec)
	ctx := context.Background()
	s := createBare(t, b, spec)
	rec := s.Record()
	// Also when the test fails before its own Cleanup (a no-op after it).
	t.Cleanup(func() { _ = b.Cleanup(context.Background(), spec.ID, rec) })
	sh(t, s, "echo kept > /tmp/state")
	s = nil // the old daemon's objects are gone; a new one reopens the store

	b2 := newDiskBackend(t)
	s2, err := b2.Recover(ctx, spec.ID, rec)
	if err != nil {
		t.Fatal(err)
	}
	if r := sh(t, s2, "cat /tmp/state; dd if=/dev/zero of=/f bs=1M 2>&1 | grep -c 'No space'"); r.stdout != "kept\n1\n" {
		t.Fatalf("recovered sandbox: %q", r.stdout)
	}
	checkConnKept(t, s2, true) // its record says PID 1 is corral-init's server
	if err := b2.Cleanup(ctx, spec.ID, rec); err != nil {
		t.Fatal(err)
	}
	assertDiskGone(t, b2, spec.ID, 0)
}
