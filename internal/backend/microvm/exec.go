package microvm

import (
	"context"
	"encoding/json"
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

// Exec implements backend.Sandbox. The agent streams the output; the node
// applies the same limiter as for containers (the agent also stops reading
// at the limit, so a flood never crosses the serial link).
func (s *sandbox) Exec(ctx context.Context, spec backend.ExecSpec, out backend.OutputFunc) (backend.ExecResult, error) {
	if err := s.live(); err != nil {
		return backend.ExecResult{}, err
	}
	if len(spec.Argv) == 0 {
		return backend.ExecResult{}, errdefs.InvalidArgument("sandbox %s: exec: argv must not be empty", s.m.id)
	}
	argv := spec.Argv
	if spec.Shell {
		// The initramfs's busybox, read-only at ShellPath: replacing the
		// image's /bin/sh does not hijack the next shell command.
		argv = append([]string{agentproto.ShellPath}, argv[1:]...)
	}
	req := &agentproto.Exec{Argv: argv, Env: spec.Env, Cwd: spec.Cwd, User: spec.User,
		Stdin: len(spec.Stdin) > 0 || spec.StdinReader != nil, OutputLimit: spec.OutputLimit}
	if spec.CPULimit > 0 {
		req.CPUSeconds = int64((spec.CPULimit + time.Second - 1) / time.Second)
	}
	start := time.Now()
	st, fs, _, err := s.agent.Open(ctx, agentproto.Request{Op: agentproto.OpExec, Exec: req})
	if err != nil {
		return backend.ExecResult{}, fmt.Errorf("sandbox %s: exec %q: %w", s.m.id, spec.Argv[0], err)
	}
	defer st.Close()
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
				results <- result{err: fmt.Errorf("lost agent stream: %w", err)}
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
				err := json.Unmarshal(p, &r)
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
	var res backend.ExecResult
	var cause error
	select {
	case x := <-results:
		return s.finish(x.r, x.err, start, lim, spec)
	case <-timer:
		res.TimedOut = true
	case <-ctx.Done():
		res.TimedOut, cause = true, ctx.Err()
	case cause = <-outErr:
	case <-s.done:
		return res, fmt.Errorf("sandbox %s: exec %q: sandbox stopped: %s", s.m.id, spec.Argv[0], s.ExitReason())
	}
	_ = fs.WriteJSON(agentproto.KindSignal, agentproto.Signal{Signal: int(unix.SIGKILL)})
	select {
	case x := <-results:
		r, err := s.finish(x.r, x.err, start, lim, spec)
		r.TimedOut = res.TimedOut
		if cause != nil {
			err = cause
		}
		return r, err
	case <-s.done:
		return res, errors.Join(cause, fmt.Errorf("sandbox %s: sandbox stopped", s.m.id))
	case <-time.After(killGrace):
		return res, errors.Join(cause, fmt.Errorf("sandbox %s: no exit report %v after kill", s.m.id, killGrace))
	}
}

func (s *sandbox) finish(r agentproto.Reply, err error, start time.Time, lim *backend.OutputLimiter, spec backend.ExecSpec) (backend.ExecResult, error) {
	res := backend.ExecResult{ExitCode: -1, Duration: time.Since(start), Truncated: lim.Truncated()}
	if err == nil {
		err = r.Err()
	}
	if err != nil {
		return res, fmt.Errorf("sandbox %s: exec %q: %w", s.m.id, spec.Argv[0], err)
	}
	res.ExitCode, res.Signal = r.ExitCode, r.Signal
	res.CPUTime = time.Duration(r.CPUNanos)
	res.OOMKilled = r.OOMKilled
	res.Truncated = res.Truncated || r.Truncated
	return res, nil
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
