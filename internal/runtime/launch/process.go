package launch

import (
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime/pidfd"
	"golang.org/x/sys/unix"
)

// Process is a running init, watched through a pidfd (which also works for a
// non-child after a daemon restart).
type Process struct {
	Pid       int
	StartTime uint64

	pidfd *os.File
	rc    syscall.RawConn
	child bool
	done  chan struct{}
	once  sync.Once
}

func newProcess(pid, pidfd int, child bool) (*Process, error) {
	st, err := StartTime(pid)
	if err != nil {
		unix.Close(pidfd)
		return nil, fmt.Errorf("init %d: %w", pid, err)
	}
	if err := unix.SetNonblock(pidfd, true); err != nil {
		unix.Close(pidfd)
		return nil, fmt.Errorf("init %d: pidfd: %w", pid, err)
	}
	f := os.NewFile(uintptr(pidfd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("init %d: pidfd: %w", pid, err)
	}
	p := &Process{Pid: pid, StartTime: st, pidfd: f, rc: rc, child: child, done: make(chan struct{})}
	go p.watch()
	return p, nil
}

// Attach re-attaches to an init that this process did not start. The start
// time guards against a reused pid; an exited or foreign pid gives an
// errdefs.NotFound error.
func Attach(pid int, startTime uint64) (*Process, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, errdefs.NotFound("init %d: %v", pid, err)
	}
	// Check after opening: the pidfd now pins this very process.
	st, err := StartTime(pid)
	if err != nil || st != startTime {
		unix.Close(fd)
		return nil, errdefs.NotFound("init %d: pid reused or gone", pid)
	}
	return newProcess(pid, fd, false)
}

// watch closes done when the process has exited, reaping it if it is ours.
func (p *Process) watch() {
	_ = p.rc.Read(func(fd uintptr) bool {
		if !pidfd.Exited(int(fd)) {
			return false
		}
		if p.child {
			var info unix.Siginfo
			for unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG, nil) == unix.EINTR {
			}
		}
		return true
	})
	p.once.Do(func() { close(p.done) })
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Kill sends SIGKILL (which ends the whole PID namespace).
func (p *Process) Kill() error {
	var err error
	cerr := p.rc.Control(func(fd uintptr) {
		err = unix.PidfdSendSignal(int(fd), unix.SIGKILL, nil, 0)
	})
	if cerr != nil {
		return nil // pidfd released: the process is gone
	}
	if err != nil && err != unix.ESRCH {
		return fmt.Errorf("kill init %d: %w", p.Pid, err)
	}
	return nil
}

// Release closes the pidfd once the process is gone (Done is closed).
func (p *Process) Release() { p.pidfd.Close() }

// Alive reports whether the process has not exited, asking the kernel now
// (not the watcher), so a path like /proc/<pid>/root opened before this call
// is known to belong to this very process.
func (p *Process) Alive() bool {
	alive := false
	_ = p.rc.Control(func(fd uintptr) { alive = !pidfd.Exited(int(fd)) })
	return alive
}

// Adopt watches a child this process started with SysProcAttr.PidFD set
// (a VMM, say), reaping it when it exits.
func Adopt(pid, pidfd int) (*Process, error) { return newProcess(pid, pidfd, true) }
