package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/initproto"
	"github.com/corral-dev/corral/internal/runtime/launch"
	"golang.org/x/sys/unix"
)

// killGrace bounds how long Exec waits for the exit report after it killed
// the command (init may be frozen or gone).
const killGrace = 5 * time.Second

// Exec implements backend.Sandbox. Output is read on the node from pipes
// whose write ends init hands to the command; it never lands in the sandbox.
func (s *sandbox) Exec(ctx context.Context, spec backend.ExecSpec, out backend.OutputFunc) (backend.ExecResult, error) {
	if err := s.live(); err != nil {
		return backend.ExecResult{}, err
	}
	if len(spec.Argv) == 0 {
		return backend.ExecResult{}, errdefs.InvalidArgument("sandbox %s: exec: argv must not be empty", s.id)
	}
	if spec.ThenReset && s.pool == nil {
		return backend.ExecResult{}, errdefs.InvalidArgument("sandbox %s: exec: then reset: not a resettable sandbox", s.id)
	}
	if s.pool != nil {
		s.holdReset(nil) // this command runs after that reset
	}
	oomBefore, oomErr := s.oomBefore()
	start := time.Now()
	var pipes *stdio
	var err error
	if spec.PTY != nil {
		pipes, err = s.newPTYStdio(*spec.PTY)
	} else {
		pipes, err = newStdio(len(spec.Stdin) > 0 || spec.StdinReader != nil)
	}
	if err != nil {
		return backend.ExecResult{}, fmt.Errorf("sandbox %s: exec: %w", s.id, err)
	}
	defer pipes.close()
	argv := spec.Argv
	if spec.Shell && s.b.cfg.Shell != "" {
		// The node's shell, mounted read-only: replacing /bin/sh inside
		// does not hijack the harness's next shell command.
		argv = append([]string{initproto.ShellPath}, argv[1:]...)
	}
	req := initproto.ExecRequest{Argv: argv, Env: spec.Env, Cwd: spec.Cwd, User: spec.User, Tty: spec.PTY != nil,
		ThenReset: spec.ThenReset, ResetKeep: spec.ResetKeep, NoStarted: spec.Started == nil}
	if spec.CPULimit > 0 {
		req.CPUSeconds = int64((spec.CPULimit + time.Second - 1) / time.Second)
	}
	e, err := s.client.Exec(ctx, req, pipes.child)
	pipes.closeChildEnds()
	if err != nil {
		return backend.ExecResult{}, fmt.Errorf("sandbox %s: exec %q: %w", s.id, spec.Argv[0], err)
	}
	defer e.Close()
	if spec.Started != nil {
		spec.Started(&process{exec: e, pty: pipes.ptm})
	}
	go pipes.feedStdin(spec.Stdin, spec.StdinReader)

	limit := spec.OutputLimit
	if limit <= 0 {
		limit = math.MaxInt64
	}
	lim := backend.NewOutputLimiter(limit, out)
	rd := &readers{lim: lim, outErr: make(chan error, 2)}
	rd.start(pipes.outR, backend.Stdout)
	if pipes.errR != nil {
		rd.start(pipes.errR, backend.Stderr)
	}

	res, reset, waitErr := s.wait(ctx, e, spec.Timeout, rd)
	res.Duration = time.Since(start)
	if reset != nil {
		s.holdReset(reset)
	}
	rd.finish(pipes.outR, pipes.errR)
	res.Truncated = lim.Truncated()
	// Any OOM kill in the sandbox while the command ran counts: in
	// `sh -c 'a | b'` the victim is usually a child, not the main process.
	if oomErr == nil {
		if after, err := s.oomAfter(); err == nil && after > oomBefore {
			res.OOMKilled = true
		}
	}
	if waitErr == nil {
		waitErr = rd.err()
	}
	if waitErr != nil {
		return res, fmt.Errorf("sandbox %s: exec %q: %w", s.id, spec.Argv[0], waitErr)
	}
	return res, nil
}

// wait waits for the exit, killing the process group on timeout,
// cancellation or an output callback error. It also returns the outcome of
// the reset init did after the command, if any.
func (s *sandbox) wait(ctx context.Context, e *launch.Exec, timeout time.Duration, rd *readers) (backend.ExecResult, *launch.ResetOutcome, error) {
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	var res backend.ExecResult
	var cause error
	select {
	case x := <-e.Exited():
		r, err := exitResult(x)
		return r, x.Reset, err
	case <-timer:
		res.TimedOut = true
	case <-ctx.Done():
		res.TimedOut, cause = true, ctx.Err()
	case cause = <-rd.outErr:
	case <-s.proc.Done():
		return res, nil, fmt.Errorf("sandbox stopped")
	}
	_ = e.Signal(int(unix.SIGKILL))
	select {
	case x := <-e.Exited():
		r, err := exitResult(x)
		r.TimedOut = res.TimedOut
		if cause != nil {
			err = cause
		}
		return r, x.Reset, err
	case <-s.proc.Done():
		return res, nil, errors.Join(cause, fmt.Errorf("sandbox stopped"))
	case <-time.After(killGrace):
		return res, nil, errors.Join(cause, fmt.Errorf("no exit report %v after kill", killGrace))
	}
}

func exitResult(x launch.ExitResult) (backend.ExecResult, error) {
	if x.NotStarted != nil {
		return backend.ExecResult{}, x.NotStarted
	}
	if x.Err != nil {
		return backend.ExecResult{ExitCode: -1}, fmt.Errorf("lost init connection: %w", x.Err)
	}
	return backend.ExecResult{ExitCode: x.Code, Signal: x.Signal, CPUTime: x.CPU}, nil
}

// stdio are the node's pipes of one exec.
type stdio struct {
	outR, errR, inW *os.File
	// child are the command's ends (stdout, stderr, stdin; -1 for none):
	// plain blocking fds that only go to init, never into Go's poller.
	child [3]int
	// ptm is the terminal's master side of a PTY exec (then outR and inW
	// are it too, and errR is nil); pts, its peer, is then all of child.
	ptm, pts *os.File
}

func newStdio(stdin bool) (*stdio, error) {
	p := &stdio{child: [3]int{-1, -1, -1}}
	var err error
	if p.outR, p.child[0], err = pipe(true); err != nil {
		return nil, err
	}
	if p.errR, p.child[1], err = pipe(true); err != nil {
		p.close()
		return nil, err
	}
	if stdin {
		if p.inW, p.child[2], err = pipe(false); err != nil {
			p.close()
			return nil, err
		}
	}
	return p, nil
}

// pipe makes a pipe whose node end (the read end if nodeReads) is an
// *os.File in Go's poller and whose command's end is a plain blocking fd.
// os.Pipe would put both ends in the poller, and handing one to init
// (File.Fd) would take it out again: six system calls more per pipe, on
// every exec.
func pipe(nodeReads bool) (node *os.File, child int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, -1, fmt.Errorf("pipe: %w", err)
	}
	n, c := p[0], p[1]
	if !nodeReads {
		n, c = c, n
	}
	// A fresh pipe end has no other status flag to keep.
	if _, err := unix.FcntlInt(uintptr(n), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		unix.Close(n)
		unix.Close(c)
		return nil, -1, fmt.Errorf("pipe: non-blocking: %w", err)
	}
	return os.NewFile(uintptr(n), "pipe"), c, nil
}

func (p *stdio) closeChildEnds() {
	if p.pts != nil {
		p.pts.Close()
		p.pts = nil
	} else {
		for _, fd := range p.child {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}
	p.child = [3]int{-1, -1, -1}
}

func (p *stdio) feedStdin(data []byte, r io.Reader) {
	if p.inW == nil {
		return
	}
	if p.ptm != nil {
		// The terminal stays open after its input ends: closing the
		// master would hang up the command.
		if r != nil {
			_, _ = io.Copy(p.ptm, r)
		} else {
			_, _ = p.ptm.Write(data)
		}
		return
	}
	// EPIPE when the command does not read.
	if r != nil {
		_, _ = io.Copy(p.inW, r)
	} else {
		_, _ = p.inW.Write(data)
	}
	p.inW.Close()
}

func (p *stdio) close() {
	p.closeChildEnds()
	if p.ptm != nil {
		p.ptm.Close()
		return
	}
	for _, f := range []*os.File{p.outR, p.errR, p.inW} {
		if f != nil {
			f.Close()
		}
	}
}
