package container

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

// TestKillAllButAndCPUUsage: CPUUsage counts a detached spinner that the
// command did not wait for, and KillAllBut kills it (and every other
// process) but the pids it keeps and init.
func TestKillAllButAndCPUUsage(t *testing.T) {
	s := newSandbox(t, newBackend(t), resettable)
	rs := s.(backend.Resetter)
	u0, err := rs.CPUUsage()
	if err != nil {
		t.Fatal(err)
	}
	r := sh(t, s, "sleep 1000 >/dev/null 2>&1 & echo $!; (while :; do :; done) >/dev/null 2>&1 &")
	keep := strings.TrimSpace(r.stdout)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		u, err := rs.CPUUsage()
		if err != nil {
			t.Fatal(err)
		}
		if u-u0 >= 100*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cpu usage %v after 20s of a detached spinner", u-u0)
		}
	}
	var pid int
	for _, c := range keep {
		pid = pid*10 + int(c-'0')
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rs.KillAllBut(ctx, []int{pid}); err != nil {
		t.Fatal(err)
	}
	// Only init and the kept sleep are left (ps and its shell aside).
	r = sh(t, s, "ps -o pid= -o comm=")
	var left []string
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[1] != "ps" && f[1] != "sh" {
			left = append(left, f[1])
		}
	}
	if strings.Join(left, " ") != "corral-init sleep" {
		t.Fatalf("processes after KillAllBut(%d): %q", pid, r.stdout)
	}
}
