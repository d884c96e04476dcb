package agent

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
	"github.com/corral-dev/corral/internal/guest/exec"
)

// drainWait bounds how long output is read after the command exited: a
// background process it left may hold the pipes open forever.
const drainWait = 200 * time.Millisecond

type exitStatus struct {
	ws unix.WaitStatus
	ru unix.Rusage
}

// reaper waits for every child (PID 1 inherits all orphans) and hands the
// exits of started commands to their exec.
type reaper struct {
	mu      sync.Mutex // held while forking+registering and while reaping
	waiters map[int]chan exitStatus
}

func newReaper() *reaper { return &reaper{waiters: map[int]chan exitStatus{}} }

func (r *reaper) run(sigs <-chan os.Signal) {
	for sig := range sigs {
		if sig != unix.SIGCHLD {
			continue
		}
		r.mu.Lock()
		for {
			var st exitStatus
			pid, err := unix.Wait4(-1, &st.ws, unix.WNOHANG, &st.ru)
			if err == unix.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			if ch, ok := r.waiters[pid]; ok {
				delete(r.waiters, pid)
				ch <- st
			}
		}
		r.mu.Unlock()
	}
}

func (r *reaper) start(argv0 string, argv []string, attr *syscall.ProcAttr) (int, chan exitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

func (s *server) exec(fs *agentproto.Stream, req *agentproto.Exec) {
	if req == nil || len(req.Argv) == 0 {
		replyErr(fs, errdefs.InvalidArgument("exec: argv must not be empty"))
		return
	}
	cred, err := guestexec.User(req.User)
	if err != nil {
		replyErr(fs, err)
		return
	}
	if req.Cwd, err = guestexec.Cwd(req.Cwd); err != nil {
		replyErr(fs, err)
		return
	}
	argv0, err := guestexec.LookPath(req.Argv[0], req.Env)
	if err != nil {
		replyErr(fs, err)
		return
	}
	var sio *stdio
	if req.PTY != nil {
		sio, err = ptyStdio(*req.PTY)
	} else {
		sio, err = pipeStdio(req.Stdin)
	}
	if err != nil {
		replyErr(fs, fmt.Errorf("exec: %w", err))
		return
	}
	oomBefore := oomKills()
	sys := &syscall.SysProcAttr{Setsid: true, Credential: cred}
	if req.PTY != nil {
		// The terminal (the child's fd 0) becomes its controlling one.
		sys.Setctty, sys.Ctty = true, 0
	}
	s.cmds.join(sys)
	attr := &syscall.ProcAttr{
		Dir:   req.Cwd,
		Env:   req.Env,
		Files: []uintptr{sio.child[0].Fd(), sio.child[1].Fd(), sio.child[2].Fd()},
		Sys:   sys,
	}
	pid, done, err := s.procs.start(argv0, req.Argv, attr)
	sio.closeChild()
	if err != nil {
		sio.closeParent()
		replyErr(fs, startError(req.Argv[0], err))
		return
	}
	if req.CPUSeconds > 0 {
		lim := unix.Rlimit{Cur: uint64(req.CPUSeconds), Max: uint64(req.CPUSeconds) + 1}
		_ = unix.Prlimit(pid, unix.RLIMIT_CPU, &lim, nil)
	}
	reply(fs, agentproto.Reply{Op: agentproto.ReplyStarted, Pid: pid})
	go relayInput(fs, pid, sio)

	limit := req.OutputLimit
	if limit <= 0 {
		limit = math.MaxInt64
	}
	lim := backend.NewOutputLimiter(limit, func(stream backend.Stream, p []byte) error {
		kind := agentproto.KindStdout
		if stream == backend.Stderr {
			kind = agentproto.KindStderr
		}
		return fs.Write(kind, p)
	})
	var wg sync.WaitGroup
	for _, p := range sio.outputs() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			copyOutput(p.f, p.stream, lim)
		}()
	}
	st := <-done
	sio.drain(time.Now().Add(drainWait))
	wg.Wait()
	sio.closeOutputs()
	r := agentproto.Reply{Op: agentproto.ReplyExit, ExitCode: st.ws.ExitStatus(),
		CPUNanos: st.ru.Utime.Nano() + st.ru.Stime.Nano(), Truncated: lim.Truncated(),
		OOMKilled: oomKills() > oomBefore}
	if st.ws.Signaled() {
		r.ExitCode, r.Signal = -1, int(st.ws.Signal())
	}
	reply(fs, r)
}

// copyOutput forwards one pipe through the limiter; past the limit it
// closes the pipe so the writer gets SIGPIPE instead of filling memory.
func copyOutput(f *os.File, stream backend.Stream, lim *backend.OutputLimiter) {
	backend.CopyPipe(f, make([]byte, agentproto.ChunkSize), func(p []byte) bool {
		if more, err := lim.Deliver(stream, p); !more || err != nil {
			f.Close()
			return false
		}
		return true
	})
}

// relayInput feeds stdin frames to the command, applies signal frames to
// its process group and resize frames to its terminal, until the node
// closes its side.
func relayInput(fs *agentproto.Stream, pgid int, sio *stdio) {
	defer sio.closeInput()
	for {
		kind, p, err := fs.Read()
		if err != nil {
			return
		}
		switch kind {
		case agentproto.KindStdin:
			sio.write(p)
		case agentproto.KindEOF:
			sio.closeInput()
		case agentproto.KindSignal:
			var sig agentproto.Signal
			if decode(p, &sig) == nil && sig.Signal > 0 {
				_ = unix.Kill(-pgid, unix.Signal(sig.Signal))
			}
		case agentproto.KindResize:
			var size agentproto.TermSize
			if decode(p, &size) == nil {
				_ = sio.resize(size)
			}
		}
	}
}

// oomKills is the guest kernel's count of OOM kills so far.
func oomKills() uint64 {
	b, err := os.ReadFile("/proc/vmstat")
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("oom_kill ")); ok {
			n, _ := strconv.ParseUint(string(v), 10, 64)
			return n
		}
	}
	return 0
}

func startError(argv0 string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return errdefs.NotFound("exec: %s: no such file (or its interpreter)", argv0)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return errdefs.PermissionDenied("exec: %s: %v", argv0, err)
	}
	return fmt.Errorf("exec %s: %w", argv0, err)
}
