package safefs

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// escapeLinks plants symlinks that would leave the root if followed on the
// host.
func (s *sandbox) escapeLinks(t *testing.T) {
	t.Helper()
	must(t, os.Symlink("/", s.root+"/escape"))
	must(t, os.Symlink("../../../../", s.root+"/up"))
	must(t, os.Symlink(s.outside, s.root+"/hostabs"))
	must(t, os.Symlink("../outside/canary.txt", s.root+"/canary-link"))
}

func TestTraversalNeverLeavesRoot(t *testing.T) {
	s := newSandbox(t)
	s.escapeLinks(t)
	ctx := context.Background()
	reads := []string{
		"/../outside/canary.txt", "/../../outside/canary.txt", "/escape/../outside/canary.txt",
		"/up/outside/canary.txt", "/up/../outside/canary.txt", "/hostabs/canary.txt", "/canary-link",
	}
	for _, p := range reads {
		got, err := read(t, s.fs, p, 0, 0)
		if got == canary {
			t.Fatalf("%s: read the host canary", p)
		}
		if !errdefs.IsNotFound(err) {
			t.Fatalf("%s: %v, want not found", p, err)
		}
	}
	for _, p := range []string{"/escape/etc/passwd", "/up/etc/passwd", "/../../etc/passwd"} {
		if got, err := read(t, s.fs, p, 0, 0); err != nil || got != "inside" {
			t.Fatalf("%s: %q %v, want the root's own file", p, got, err)
		}
	}
	for _, p := range reads {
		_ = write(s.fs, p, "pwned", backend.WriteOptions{MakeParents: true})
		s.checkCanary(t)
	}
	// The writes landed inside the root.
	if b, err := os.ReadFile(s.root + "/outside/canary.txt"); err != nil || string(b) != "pwned" {
		t.Fatalf("in-root write: %q %v", b, err)
	}
	for _, p := range append(reads, "/up/outside", "/hostabs") {
		_ = s.fs.Remove(ctx, p, true)
		s.checkCanary(t)
	}
	must(t, s.fs.Remove(ctx, "/escape", true)) // the link only
	if _, err := os.Stat(s.root + "/etc/passwd"); err != nil {
		t.Fatal(err)
	}
	s.checkCanary(t)
}

// TestSwappedSymlink races every operation against a directory that flips
// between a real directory and a symlink pointing out of the root.
func TestSwappedSymlink(t *testing.T) {
	s := newSandbox(t)
	ctx := context.Background()
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		targets := []string{"../outside", s.outside, "../../../outside"}
		for i := 0; !stop.Load(); i++ {
			_ = os.MkdirAll(s.root+"/a/b", 0o755)
			_ = os.WriteFile(s.root+"/a/canary.txt", []byte("inside"), 0o644)
			_ = os.Rename(s.root+"/a", s.root+"/old")
			_ = os.Symlink(targets[i%len(targets)], s.root+"/a")
			_ = os.Remove(s.root + "/a")
			_ = os.RemoveAll(s.root + "/old")
		}
	}()
	for i := 0; i < 2000; i++ {
		if got, _ := read(t, s.fs, "/a/canary.txt", 0, 0); got == canary {
			t.Fatal("read the host canary through a swapped link")
		}
		_ = write(s.fs, "/a/canary.txt", "pwned", backend.WriteOptions{})
		_ = write(s.fs, "/a/b/new", "x", backend.WriteOptions{MakeParents: true})
		_ = s.fs.Remove(ctx, "/a/canary.txt", false)
		_ = s.fs.Remove(ctx, "/a/b", true)
		_, _ = s.fs.ListDir(ctx, "/a")
	}
	stop.Store(true)
	wg.Wait()
	s.checkCanary(t)
	if _, err := os.Stat(s.outside + "/b"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("made a directory outside the root: %v", err)
	}
}
