package initproc

import (
	"fmt"

	"github.com/corral-dev/corral/internal/runtime/osthread"
	"github.com/corral-dev/corral/internal/runtime/seccomp"
	"golang.org/x/sys/unix"
)

// forker is the one OS thread of a pooled init that forks commands. It has
// its own root (unshare CLONE_FS, chroot into the view), none of poolCaps in
// any set (bounding included) and the commands' seccomp filter stacked on
// init's, so every command starts inside the view with exactly a container
// sandbox's privileges. Path lookups for an exec (cwd, PATH, /etc/passwd)
// run on it too, so they resolve inside the view. A reset that re-mounts
// the view retires the forker (its thread exits with it) and makes a new one.
type forker struct {
	reqs chan func()
}

func newForker(filter []byte) (*forker, error) {
	f := &forker{reqs: make(chan func())}
	errc := make(chan error, 1)
	// Not on the thread group leader: its root is the one /proc/<init>/root
	// shows the node, whose file API reaches the view through it (a forker
	// there, now and then after a renew, left every file call failing).
	osthread.Go(func() { f.serve(filter, errc) })
	if err := <-errc; err != nil {
		return nil, fmt.Errorf("forker: %w", err)
	}
	return f, nil
}

// serve confines its thread and runs f's requests on it until stop; errc
// gets the outcome of the confining.
func (f *forker) serve(filter []byte, errc chan<- error) {
	if err := confine(filter); err != nil {
		errc <- err
		return
	}
	errc <- nil
	for fn := range f.reqs {
		fn()
	}
}

// run runs fn on the forker thread and waits for it.
func (f *forker) run(fn func()) {
	done := make(chan struct{})
	f.reqs <- func() { fn(); close(done) }
	<-done
}

// stop ends the forker thread.
func (f *forker) stop() { close(f.reqs) }

func confine(filter []byte) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare fs: %w", err)
	}
	if err := unix.Chroot(poolView); err != nil {
		return fmt.Errorf("chroot %s: %w", poolView, err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	for _, c := range poolCaps {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			return fmt.Errorf("drop bounding cap %d: %w", c, err)
		}
	}
	if err := setCaps(DefaultCaps, DefaultCaps); err != nil {
		return err
	}
	if len(filter) == 0 {
		return nil // runtime tests without seccomp
	}
	prog, err := seccomp.Decode(filter)
	if err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	return seccomp.InstallThread(prog)
}
