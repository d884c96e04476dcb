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
//
// A forker made with freshNet first moves its thread into a network
// namespace of its own with only lo, up; its commands inherit it. A
// recyclable sandbox's next tenant gets one when the last tenant used the
// network (see pool.netUnchanged), so that nothing it did on loopback
// (ports in TIME_WAIT, the interface's and the IP stack's counters) is
// there for the next to read.
type forker struct {
	reqs chan func()
	tid  int // its thread, whose network namespace its commands inherit
}

func newForker(filter []byte, freshNet bool) (*forker, error) {
	f := &forker{reqs: make(chan func())}
	errc := make(chan error, 1)
	// Not on the thread group leader: its root is the one /proc/<init>/root
	// shows the node, whose file API reaches the view through it (a forker
	// there, now and then after a renew, left every file call failing).
	osthread.Go(func() { f.serve(filter, freshNet, errc) })
	if err := <-errc; err != nil {
		return nil, fmt.Errorf("forker: %w", err)
	}
	return f, nil
}

// serve confines its thread and runs f's requests on it until stop; errc
// gets the outcome of the confining.
func (f *forker) serve(filter []byte, freshNet bool, errc chan<- error) {
	if freshNet {
		if err := enterFreshNetns(); err != nil {
			errc <- err
			return
		}
	}
	if err := confine(filter); err != nil {
		errc <- err
		return
	}
	f.tid = unix.Gettid()
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

// enterFreshNetns moves the calling thread into a new network namespace and
// brings its lo up (CAP_SYS_ADMIN and CAP_NET_ADMIN of poolCaps, before
// confine drops them). The last namespace goes with its last process.
func enterFreshNetns() error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare net: %w", err)
	}
	return loopbackUp()
}

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
