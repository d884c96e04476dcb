package initproc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"syscall"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/exec"
	"github.com/corral-dev/corral/internal/guest/initproto"
	"golang.org/x/sys/unix"
)

// reqError is a request error with a class the node maps to errdefs.
type reqError struct {
	class string
	err   error
}

func (e *reqError) Error() string { return e.err.Error() }

func classify(err error) string {
	var re *reqError
	if errors.As(err, &re) {
		return re.class
	}
	switch {
	case errdefs.IsNotFound(err):
		return initproto.ClassNotFound
	case errdefs.IsInvalidArgument(err):
		return initproto.ClassInvalidArgument
	case errdefs.IsPermissionDenied(err):
		return initproto.ClassPermissionDenied
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return initproto.ClassNotFound
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return initproto.ClassPermissionDenied
	case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.ENOMEM):
		return initproto.ClassResource
	case errors.Is(err, unix.ENOEXEC), errors.Is(err, unix.E2BIG):
		return initproto.ClassInvalidArgument
	}
	return initproto.ClassInternal
}

// commandOOMScoreAdj is every command's oom_score_adj: killed first.
var commandOOMScoreAdj = []byte("1000")

// start forks and execs one command in its own process group, calling
// forked with its pid first thing (the command runs already). It returns
// the command's pidfd (-1 if the kernel gives none; the caller owns it) and
// the channel that receives its wait status.
func (s *server) start(req *initproto.ExecRequest, stdio [3]int, forked func(pid int)) (int, int, chan exitStatus, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return 0, -1, nil, &reqError{initproto.ClassInvalidArgument, errors.New("exec: empty argv")}
	}
	cred, err := guestexec.User(req.User)
	if err != nil {
		return 0, -1, nil, err
	}
	cwd, err := guestexec.Cwd(req.Cwd)
	if err != nil {
		return 0, -1, nil, err
	}
	path, err := guestexec.LookPath(req.Argv[0], req.Env)
	if err != nil {
		return 0, -1, nil, err
	}
	pidfd := -1
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   req.Env,
		Files: []uintptr{uintptr(stdio[0]), uintptr(stdio[1]), uintptr(stdio[2])},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Credential: cred, PidFD: &pidfd},
	}
	if req.Tty {
		// A new session is also a new process group of the same id.
		attr.Sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Credential: cred, PidFD: &pidfd}
	}
	done := make(chan exitStatus, 1)
	s.mu.Lock()
	var pid int
	if s.gate >= 0 {
		pid, err = s.startGated(path, req.Argv, attr, forked)
	} else {
		pid, err = syscall.ForkExec(path, req.Argv, attr)
		if err == nil {
			forked(pid)
		}
	}
	if err == nil {
		s.waiters[pid] = done
	}
	s.mu.Unlock()
	if err != nil {
		if pidfd >= 0 { // a gate that started but could not exec
			unix.Close(pidfd)
		}
		return 0, -1, nil, fmt.Errorf("exec %s: %w", req.Argv[0], err)
	}
	// Commands are what an OOM kill in the sandbox takes, before init:
	// init's own -1000 (hardenAndExec) needs CAP_SYS_RESOURCE, which a node
	// may lack (then init stays at 0 and, after a memory bomb's kill, a
	// second kill could take it). Raising the score needs no capability;
	// a command may lower its own back to init's, never below.
	// Plain system calls: os.WriteFile would also register the file with
	// Go's poller and set a finalizer, on every exec.
	if fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", unix.O_WRONLY|unix.O_CLOEXEC, 0); err == nil {
		_, _ = unix.Write(fd, commandOOMScoreAdj)
		unix.Close(fd)
	}
	if n := req.CPUSeconds; n > 0 {
		lim := unix.Rlimit{Cur: uint64(n), Max: uint64(n) + 1}
		_ = unix.Prlimit(pid, unix.RLIMIT_CPU, &lim, nil)
	}
	return pid, pidfd, done, nil
}

// startGated starts a command through the stub's gate: forked (the stub
// told) before the command runs a single instruction of its own, as the
// command could kill the server. The caller holds s.mu, so that the exit of
// a gate whose exec failed is reaped after its pid is known here.
func (s *server) startGated(path string, argv []string, attr *syscall.ProcAttr, forked func(pid int)) (int, error) {
	var goAhead, execErr [2]int
	if err := unix.Pipe2(goAhead[:], unix.O_CLOEXEC); err != nil {
		return 0, err
	}
	defer unix.Close(goAhead[1])
	if err := unix.Pipe2(execErr[:], unix.O_CLOEXEC); err != nil {
		unix.Close(goAhead[0])
		return 0, err
	}
	defer unix.Close(execErr[0])
	gated := *attr
	gated.Files = append(slices.Clone(attr.Files), uintptr(goAhead[0]), uintptr(execErr[1]), uintptr(s.gate))
	pid, err := syscall.ForkExec("/proc/self/fd/"+strconv.Itoa(len(gated.Files)-1), append([]string{gateName, path}, argv...), &gated)
	unix.Close(goAhead[0])
	unix.Close(execErr[1])
	if err != nil {
		return 0, err
	}
	forked(pid)
	if _, err := unix.Write(goAhead[1], []byte{1}); err != nil {
		return 0, fmt.Errorf("start gate: %w", err)
	}
	var b [4]byte
	n, _ := readFull(execErr[0], b[:])
	if n == len(b) {
		s.tell(pid, nil) // the gate exits 127, unreported
		return 0, syscall.Errno(binary.NativeEndian.Uint32(b[:]))
	}
	return pid, nil
}

// readFull reads fd until b is full or EOF.
func readFull(fd int, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := unix.Read(fd, b[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || m == 0 {
			return n, err
		}
		n += m
	}
	return n, nil
}
