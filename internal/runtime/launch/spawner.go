package launch

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/initproto"
	"github.com/corral-dev/corral/internal/runtime/spawner"
	"golang.org/x/sys/unix"
)

// spawnerRetry is how long the node spawns directly after a spawner failed
// to start, before it tries to start one again.
const spawnerRetry = 10 * time.Second

// Spawner is the node's side of the spawner (internal/runtime/spawner): a
// corral-init process in spawner mode that clones inits on request. Spawn
// goes through it when SpawnConfig.Spawner is set; if it has died, the next
// spawn starts another, and if that fails the node spawns directly (slower:
// a fork of the daemon) with a log line.
type Spawner struct {
	path string
	log  *slog.Logger
	// starts is served by one goroutine locked to its thread, which starts
	// every spawner process: PR_SET_PDEATHSIG fires when the thread that
	// forked the child ends, so that thread must live as long as the node.
	starts chan chan startResult

	mu      sync.Mutex
	cur     *spawnerProc // nil: none running
	retryAt time.Time
	closed  bool
}

type startResult struct {
	p   *spawnerProc
	err error
}

type spawnerProc struct {
	conn *initproto.Conn
	pid  int
	done chan struct{}
}

// NewSpawner starts a spawner from initPath (the node's trusted corral-init).
// A failed start is logged and leaves the node spawning directly for a while.
func NewSpawner(initPath string, log *slog.Logger) *Spawner {
	s := &Spawner{path: initPath, log: log, starts: make(chan chan startResult)}
	go s.starter()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.startLocked(); err != nil {
		s.log.Warn("spawner did not start: inits are spawned from the daemon (slower)", "err", err)
	}
	return s
}

// Pid is the running spawner's pid, 0 if none.
func (s *Spawner) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return 0
	}
	return s.cur.pid
}

// Close stops the spawner. The inits it started keep running.
func (s *Spawner) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	p := s.cur
	s.cur = nil
	s.mu.Unlock()
	if p != nil {
		p.conn.Close() // the spawner exits at EOF
		<-p.done
	}
	close(s.starts)
	return nil
}

func (s *Spawner) starter() {
	runtime.LockOSThread() // never unlocked: see starts
	for res := range s.starts {
		p, err := s.startProc()
		res <- startResult{p, err}
	}
}

func (s *Spawner) startLocked() error {
	res := make(chan startResult, 1)
	s.starts <- res
	r := <-res
	if r.err != nil {
		s.retryAt = time.Now().Add(spawnerRetry)
		return r.err
	}
	s.cur = r.p
	return nil
}

func (s *Spawner) startProc() (*spawnerProc, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spawner: socket: %w", err)
	}
	child := os.NewFile(uintptr(pair[1]), "spawner-child")
	defer child.Close()
	conn, err := initproto.NewConn(pair[0], "spawner")
	if err != nil {
		return nil, fmt.Errorf("spawner: socket: %w", err)
	}
	cmd := exec.Command(s.path, spawner.Arg)
	cmd.ExtraFiles = []*os.File{child} // spawner.ControlFd
	cmd.Stderr = os.Stderr
	// Its Go runtime with one P: the work is syscalls, and fewer threads
	// keep its fork small.
	cmd.Env = []string{"GOMAXPROCS=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("spawner: %w", err)
	}
	p := &spawnerProc{conn: conn, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		close(p.done)
		s.mu.Lock()
		closed := s.closed
		if s.cur == p {
			s.cur = nil
		}
		s.mu.Unlock()
		if !closed {
			s.log.Warn("spawner exited; the next create starts another", "pid", p.pid, "err", err)
		}
	}()
	return p, nil
}

// get returns the running spawner, starting one if it has died; nil: spawn
// directly.
func (s *Spawner) get() *spawnerProc {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if s.cur != nil {
		select {
		case <-s.cur.done:
			s.cur = nil
		default:
			return s.cur
		}
	}
	if time.Now().Before(s.retryAt) {
		return nil
	}
	if err := s.startLocked(); err != nil {
		s.log.Warn("spawner did not restart: inits are spawned from the daemon (slower)", "err", err, "retry_in", spawnerRetry)
		return nil
	}
	s.log.Info("spawner restarted", "pid", s.cur.pid)
	return s.cur
}

// drop forgets p after a request could not be sent to it.
func (s *Spawner) drop(p *spawnerProc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == p {
		s.cur = nil
		p.conn.Close()
	}
}

// spawn asks the spawner for init. ok is false when there is no spawner to
// ask (the caller spawns directly); a request the spawner got is never
// repeated, since it may have cloned an init before failing.
func (s *Spawner) spawn(sc SpawnConfig, setupChild *os.File) (pid, pidfd int, ok bool, err error) {
	for range 2 {
		p := s.get()
		if p == nil {
			return 0, 0, false, nil
		}
		pid, pidfd, sent, err := p.request(sc, setupChild)
		if sent {
			return pid, pidfd, true, err
		}
		s.log.Warn("spawner unreachable", "pid", p.pid, "err", err)
		s.drop(p)
	}
	return 0, 0, false, nil
}

// request sends one spawn request; sent is false if it did not reach the
// spawner.
func (p *spawnerProc) request(sc SpawnConfig, setupChild *os.File) (pid, pidfd int, sent bool, err error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, 0, true, fmt.Errorf("start init: reply socket: %w", err)
	}
	theirs := os.NewFile(uintptr(pair[1]), "spawn-reply")
	reply, err := initproto.NewConn(pair[0], "spawn-reply")
	if err != nil {
		theirs.Close()
		return 0, 0, true, fmt.Errorf("start init: reply socket: %w", err)
	}
	defer reply.Close()
	files := []*os.File{theirs}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	open := func(path string, flags int) (*os.File, error) {
		f, err := os.OpenFile(path, flags|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("start init: %w", err)
		}
		files = append(files, f)
		return f, nil
	}
	dir, err := open(sc.Dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return 0, 0, true, err
	}
	stderr := sc.Stderr
	if stderr == nil {
		if stderr, err = open(os.DevNull, os.O_WRONLY); err != nil {
			return 0, 0, true, err
		}
	}
	bin, err := open(sc.InitPath, os.O_RDONLY)
	if err != nil {
		return 0, 0, true, err
	}
	req := spawner.Request{Version: spawner.Version, Flags: cloneFlags, Host: sc.IDs.Host, Size: sc.IDs.Size}
	fds := []int{int(theirs.Fd()), int(dir.Fd()), int(stderr.Fd()), int(sc.Listener.Fd()), int(setupChild.Fd()), int(bin.Fd())}
	cg, err := sc.Group.OpenV2()
	if err != nil {
		return 0, 0, true, err
	}
	if cg != nil {
		files = append(files, cg)
		req.Cgroup2 = true
		fds = append(fds, int(cg.Fd()))
	}
	if sc.Netns != nil {
		req.Netns = true
		req.Flags &^= unix.CLONE_NEWNET
		fds = append(fds, int(sc.Netns.Fd()))
	}
	tasks, err := sc.Group.OpenTasks()
	if err != nil {
		return 0, 0, true, err
	}
	files = append(files, tasks...)
	req.Tasks = len(tasks)
	for _, f := range tasks {
		fds = append(fds, int(f.Fd()))
	}
	if err := p.conn.Send(req, fds...); err != nil {
		return 0, 0, false, err
	}
	// Only the spawner holds the reply socket's other end now: its death
	// reads as EOF.
	theirs.Close()
	files = files[1:]
	var rep spawner.Reply
	got, err := reply.Recv(&rep)
	if err != nil {
		// Retrying is the caller's business: this request may have cloned.
		return 0, 0, true, errdefs.Unavailable("start init: spawner %d ended during the request: %v", p.pid, err)
	}
	if rep.Error != "" {
		closeFds(got)
		if rep.Errno != 0 {
			return 0, 0, true, fmt.Errorf("%s: %w", rep.Error, syscall.Errno(rep.Errno))
		}
		return 0, 0, true, errors.New(rep.Error)
	}
	if len(got) != 1 || rep.Pid <= 0 {
		closeFds(got)
		return 0, 0, true, fmt.Errorf("start init: spawner %d: reply without a pidfd", p.pid)
	}
	return rep.Pid, got[0], true, nil
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
