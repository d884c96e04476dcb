package container

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

// TestExecUserGroups: a named user gets its supplementary groups, and a
// group may be named after the uid (env, cwd, users by name and number,
// stdin: the conformance suite).
func TestExecUserGroups(t *testing.T) {
	s := newSandbox(t, newBackend(t), nil)
	r := run1(t, s, backend.ExecSpec{Argv: []string{"sh", "-c", "id -u; id -g; id -G"}, User: "agent"})
	if want := "1000\n1000\n1000 2000\n"; r.stdout != want {
		t.Fatalf("got %q, want %q", r.stdout, want)
	}
	r = run1(t, s, backend.ExecSpec{Argv: []string{"sh", "-c", "id -u; id -g"}, User: "1234:extra"})
	if r.stdout != "1234\n2000\n" {
		t.Fatalf("uid:group: %q", r.stdout)
	}
}

func TestExecBackgroundSurvives(t *testing.T) {
	b := newBackend(t)
	s := newSandbox(t, b, nil)
	// The background sleep keeps stdout open: Exec must still return.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := tryRun(ctx, s, backend.ExecSpec{Argv: []string{"sh", "-c", "sleep 1000 & echo started"}})
	if err != nil || r.stdout != "started\n" || r.TimedOut {
		t.Fatalf("background: %+v %v", r, err)
	}
	if r := sh(t, s, "ps -o comm | grep -c ^sleep$"); strings.TrimSpace(r.stdout) != "1" {
		t.Fatalf("background sleep not running: %q", r.stdout)
	}
	g := b.cg.Group(s.ID())
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if g.Exists() {
		t.Fatal("cgroup remains after Stop")
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
}
