package cgroup

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func testManager(t *testing.T) *Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (creates cgroups)")
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	m, err := NewManager("corral-owner-test-" + hex.EncodeToString(b))
	if err != nil {
		t.Skipf("no cgroups: %v", err)
	}
	t.Cleanup(func() { _ = m.RemoveParent() })
	return m
}

// TestClaimRefusesALiveOwner: a second claim of a held parent fails with
// the holder's pid and data dir; once released, the parent is free.
func TestClaimRefusesALiveOwner(t *testing.T) {
	m := testManager(t)
	first, err := m.Claim("/tmp/daemon-a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Claim("/tmp/daemon-b")
	var owned *OwnedError
	if !errors.As(err, &owned) {
		t.Fatalf("second claim: want *OwnedError, got %v", err)
	}
	if owned.Owner.Pid != os.Getpid() || owned.Owner.DataDir != "/tmp/daemon-a" || !strings.Contains(err.Error(), "/tmp/daemon-a") {
		t.Fatalf("error names %+v: %v", owned.Owner, err)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	second, err := m.Claim("/tmp/daemon-b")
	if err != nil {
		t.Fatalf("claim after release: %v", err)
	}
	_ = second.Release()
}

// TestClaimTakesOverADeadOwner: a parent whose holder died (its lock gone
// with it, its marker left behind) is taken over.
func TestClaimTakesOverADeadOwner(t *testing.T) {
	m := testManager(t)
	c, err := m.Claim("/tmp/daemon-dead")
	if err != nil {
		t.Fatal(err)
	}
	// Another process holds the lock: a live daemon, as far as the
	// parent can tell.
	c.dir.Close() // drops our lock, keeps the marker naming daemon-dead
	holder := exec.Command("flock", "--no-fork", "-n", m.dirs()[0], "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Skipf("flock(1): %v", err)
	}
	// Wait until flock(1) holds it (probing with a lock of our own that
	// is dropped at once).
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		f, err := os.Open(m.dirs()[0])
		if err != nil {
			t.Fatal(err)
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			break
		}
	}
	_, err = m.Claim("/tmp/daemon-new")
	var owned *OwnedError
	if !errors.As(err, &owned) {
		_ = holder.Process.Kill()
		t.Fatalf("claim while another process holds the lock: want *OwnedError, got %v", err)
	}
	_ = holder.Process.Kill()
	_ = holder.Wait()
	taken, err := m.Claim("/tmp/daemon-new")
	if err != nil {
		t.Fatalf("claim after the holder died: %v", err)
	}
	defer taken.Release()
	if _, err := m.Claim("/tmp/daemon-third"); !errors.As(err, &owned) || owned.Owner.DataDir != "/tmp/daemon-new" {
		t.Fatalf("the marker must name the new owner: %v", err)
	}
}
