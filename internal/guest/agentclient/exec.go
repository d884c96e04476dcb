package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// killGrace bounds the wait for the exit report after a kill.
const killGrace = 10 * time.Second

// ErrEnded is Exec's error when done closed while the command ran; the
// backend says why its sandbox ended.
var ErrEnded = errors.New("the sandbox ended while the command ran")

// Exec runs spec.Argv as given (the backend picks the shell) with output
// streamed through the same limiter as for containers (the agent also
// stops reading at the limit, so a flood never crosses the link), stdin
// streamed from spec, and the command's process group killed on timeout,
// cancellation or an output error. done closes when the sandbox ends.
func (c *Client) Exec(ctx context.Context, spec backend.ExecSpec, out backend.OutputFunc, done <-chan struct{}) (backend.ExecResult, error) {
	req := &agentproto.Exec{Argv: spec.Argv, Env: spec.Env, Cwd: spec.Cwd, User: spec.User,
		Stdin: len(spec.Stdin) > 0 || spec.StdinReader != nil, OutputLimit: spec.OutputLimit}
	if spec.CPULimit > 0 {
		req.CPUSeconds = int64((spec.CPULimit + time.Second - 1) / time.Second)
	}
	if spec.PTY != nil {
		if spec.PTY.Cols == 0 || spec.PTY.Rows == 0 {
			return backend.ExecResult{}, errdefs.InvalidArgument("pty.size: columns and rows must be positive (got %dx%d)", spec.PTY.Cols, spec.PTY.Rows)
		}
		req.PTY = &agentproto.TermSize{Cols: spec.PTY.Cols, Rows: spec.PTY.Rows}
	}
	start := time.Now()
	st, fs, started, err := c.Open(ctx, agentproto.Request{Op: agentproto.OpExec, Exec: req})
	if err != nil {
		return backend.ExecResult{}, err
	}
	defer st.Close()
	if spec.Started != nil {
		// Before the reader below: no output precedes the handle.
		spec.Started(&process{pid: started.Pid, fs: fs, pty: req.PTY != nil})
	}
	if req.Stdin {
		go feedStdin(fs, spec.Stdin, spec.StdinReader)
	}
	limit := spec.OutputLimit
	if limit <= 0 {
		limit = math.MaxInt64
	}
	lim := backend.NewOutputLimiter(limit, out)
	type result struct {
		r   agentproto.Reply
		err error
	}
	results := make(chan result, 1)
	outErr := make(chan error, 1)
	go func() {
		for {
			kind, p, err := fs.Read()
			if err != nil {
				results <- result{err: fmt.Errorf("lost corral-agent stream: %w", err)}
				return
			}
			switch kind {
			case agentproto.KindStdout, agentproto.KindStderr:
				stream := backend.Stdout
				if kind == agentproto.KindStderr {
					stream = backend.Stderr
				}
				if _, err := lim.Deliver(stream, p); err != nil {
					select {
					case outErr <- err:
					default:
					}
				}
			case agentproto.KindReply:
				var r agentproto.Reply
				err := decodeReply(p, &r)
				results <- result{r: r, err: err}
				return
			}
		}
	}()
	var timer <-chan time.Time
	if spec.Timeout > 0 {
		t := time.NewTimer(spec.Timeout)
		defer t.Stop()
		timer = t.C
	}
	finish := func(x result) (backend.ExecResult, error) {
		res := backend.ExecResult{ExitCode: -1, Duration: time.Since(start), Truncated: lim.Truncated()}
		err := x.err
		if err == nil {
			err = x.r.Err()
		}
		if err != nil {
			return res, err
		}
		res.ExitCode, res.Signal = x.r.ExitCode, x.r.Signal
		res.CPUTime = time.Duration(x.r.CPUNanos)
		res.OOMKilled = x.r.OOMKilled
		res.Truncated = res.Truncated || x.r.Truncated
		return res, nil
	}
	var timedOut bool
	var cause error
	select {
	case x := <-results:
		return finish(x)
	case <-timer:
		timedOut = true
	case <-ctx.Done():
		timedOut, cause = true, ctx.Err()
	case cause = <-outErr:
	case <-done:
		return backend.ExecResult{}, ErrEnded
	}
	_ = fs.WriteJSON(agentproto.KindSignal, agentproto.Signal{Signal: int(unix.SIGKILL)})
	select {
	case x := <-results:
		r, err := finish(x)
		r.TimedOut = timedOut
		if cause != nil {
			err = cause
		}
		return r, err
	case <-done:
		return backend.ExecResult{TimedOut: timedOut}, errors.Join(cause, ErrEnded)
	case <-time.After(killGrace):
		return backend.ExecResult{TimedOut: timedOut}, errors.Join(cause, fmt.Errorf("no exit report %v after kill", killGrace))
	}
}

// feedStdin sends the command's input in frames, then end-of-input.
func feedStdin(fs *agentproto.Stream, data []byte, r io.Reader) {
	if r == nil {
		for len(data) > 0 {
			n := min(len(data), agentproto.ChunkSize)
			if fs.Write(agentproto.KindStdin, data[:n]) != nil {
				return
			}
			data = data[n:]
		}
	} else {
		buf := make([]byte, agentproto.ChunkSize)
		for {
			n, err := r.Read(buf)
			if n > 0 && fs.Write(agentproto.KindStdin, buf[:n]) != nil {
				return
			}
			if err != nil {
				break
			}
		}
	}
	_ = fs.Write(agentproto.KindEOF, nil)
}

// process implements backend.Process over an exec's stream.
type process struct {
	pid int
	fs  *agentproto.Stream
	pty bool
}

func (p *process) Pid() int { return p.pid }

func (p *process) Signal(sig int) error {
	if err := p.fs.WriteJSON(agentproto.KindSignal, agentproto.Signal{Signal: sig}); err != nil {
		return fmt.Errorf("signal process %d: %w", p.pid, err)
	}
	return nil
}

func (p *process) Resize(size backend.TermSize) error {
	if !p.pty {
		return errdefs.FailedPrecondition("resize: process %d has no terminal", p.pid)
	}
	if size.Cols == 0 || size.Rows == 0 {
		return errdefs.InvalidArgument("pty.size: columns and rows must be positive (got %dx%d)", size.Cols, size.Rows)
	}
	if err := p.fs.WriteJSON(agentproto.KindResize, agentproto.TermSize{Cols: size.Cols, Rows: size.Rows}); err != nil {
		return fmt.Errorf("resize process %d: %w", p.pid, err)
	}
	return nil
}
