package safefs

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

func TestRename(t *testing.T) {
	s := newSandbox(t)
	s.escapeLinks(t)
	ctx := context.Background()
	must(t, write(s.fs, "/a/f.txt", "f", backend.WriteOptions{MakeParents: true}))
	must(t, s.fs.Rename(ctx, "/a/f.txt", "/g.txt"))
	if got, err := read(t, s.fs, "/g.txt", 0, 0); err != nil || got != "f" {
		t.Fatalf("renamed file: %q %v", got, err)
	}
	wantErr(t, s.fs.Rename(ctx, "/a/f.txt", "/h.txt"), errdefs.ErrNotFound, `path "/a/f.txt": no such file or directory`)
	wantErr(t, s.fs.Rename(ctx, "/", "/x"), errdefs.ErrInvalidArgument, "the root cannot be renamed")
	wantErr(t, s.fs.Rename(ctx, "rel", "/x"), errdefs.ErrInvalidArgument, "must be absolute")
	// Parents resolve inside the root whatever the symlinks say: the host
	// canary is neither the source nor the target.
	for _, p := range []string{"/escape/outside/canary.txt", "/up/outside/canary.txt", "/hostabs/canary.txt"} {
		_ = s.fs.Rename(ctx, p, "/stolen")
		_ = s.fs.Rename(ctx, "/g.txt", p)
		s.checkCanary(t)
		must(t, write(s.fs, "/g.txt", "f", backend.WriteOptions{}))
	}
	// A symlink as the source is moved, not followed.
	must(t, s.fs.Rename(ctx, "/hostabs", "/moved-link"))
	if target, err := os.Readlink(s.root + "/moved-link"); err != nil || target != s.outside {
		t.Fatalf("moved link: %q %v", target, err)
	}
	s.checkCanary(t)
}

func TestWatchDir(t *testing.T) {
	s := newSandbox(t)
	s.escapeLinks(t)
	must(t, os.MkdirAll(s.root+"/w/sub", 0o755))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var got []backend.WatchEvent
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.fs.WatchDir(ctx, "/w", true, func() { close(ready) }, func(ev backend.WatchEvent) {
			mu.Lock()
			got = append(got, ev)
			mu.Unlock()
		})
	}()
	<-ready
	must(t, os.WriteFile(s.root+"/w/sub/a", []byte("x"), 0o644))
	must(t, os.Mkdir(s.root+"/w/new", 0o755))
	time.Sleep(50 * time.Millisecond) // the new directory's watch is added on its create event
	must(t, os.WriteFile(s.root+"/w/new/b", []byte("y"), 0o644))
	must(t, os.Rename(s.root+"/w/sub/a", s.root+"/w/c"))
	must(t, os.Remove(s.root+"/w/c"))
	// Changes outside the watched directory are not reported.
	must(t, os.WriteFile(s.outside+"/other", []byte("z"), 0o644))
	want := []backend.WatchEvent{
		{Name: "sub/a", Op: backend.WatchCreate}, {Name: "sub/a", Op: backend.WatchWrite},
		{Name: "new", Op: backend.WatchCreate}, {Name: "new/b", Op: backend.WatchCreate},
		{Name: "sub/a", Op: backend.WatchRename}, {Name: "c", Op: backend.WatchCreate},
		{Name: "c", Op: backend.WatchRemove},
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		have := map[backend.WatchEvent]bool{}
		for _, ev := range got {
			have[ev] = true
		}
		missing := []backend.WatchEvent{}
		for _, w := range want {
			if !have[w] {
				missing = append(missing, w)
			}
		}
		for _, ev := range got {
			if ev.Name == "other" {
				t.Fatalf("reported a change outside the watched directory: %+v", ev)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("missing events %+v; got %+v", missing, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("WatchDir after cancel: %v", err)
	}
	// A symlink that points out of the root is resolved inside it: watching
	// it watches the root's own directory, or fails; never the host's.
	err := s.fs.WatchDir(context.Background(), "/hostabs", false, func() {}, func(backend.WatchEvent) {})
	if !errdefs.IsNotFound(err) {
		t.Fatalf("watch through an escaping symlink: %v, want not found", err)
	}
	wantErr(t, s.fs.WatchDir(context.Background(), "/etc/passwd", false, nil, nil), errdefs.ErrInvalidArgument, "not a directory")
}

func TestChown(t *testing.T) {
	s := newSandbox(t)
	s.escapeLinks(t)
	ctx := context.Background()
	must(t, write(s.fs, "/f", "f", backend.WriteOptions{}))
	must(t, s.fs.Chown(ctx, "/f", 1234, 4321))
	if fi, err := s.fs.Stat(ctx, "/f"); err != nil || fi.UID != 1234 || fi.GID != 4321 {
		t.Fatalf("after chown: %+v %v", fi, err)
	}
	// Through links that would leave the root: the host canary keeps its owner.
	var before, after unix.Stat_t
	must(t, unix.Stat(s.outside+"/canary.txt", &before))
	for _, p := range []string{"/hostabs/canary.txt", "/up/outside/canary.txt", "/canary-link"} {
		_ = s.fs.Chown(ctx, p, 999, 999)
	}
	must(t, unix.Stat(s.outside+"/canary.txt", &after))
	if after.Uid != before.Uid || after.Gid != before.Gid {
		t.Fatalf("the host canary's owner changed: %d:%d -> %d:%d", before.Uid, before.Gid, after.Uid, after.Gid)
	}
	wantErr(t, s.fs.Chown(ctx, "/", 1, 1), errdefs.ErrInvalidArgument, "the root's owner cannot be changed")
}
