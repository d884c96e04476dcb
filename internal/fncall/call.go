package fncall

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"golang.org/x/sys/unix"
)

// writeInputs writes a call's input files. The writes hold
// syscall.ForkLock for reading, so no process the daemon forks meanwhile
// (a pool refill's init waits for its id maps before it execs) inherits a
// file still open for writing: the call may exec the file it was given,
// and such an inherited descriptor makes that exec fail with ETXTBSY.
// Inputs are bounded by the request size, so forks wait briefly.
func writeInputs(ctx context.Context, sb backend.Sandbox, files map[string][]byte) error {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	for p, b := range files {
		if _, err := sb.WriteFile(ctx, absPath(p), bytes.NewReader(b), backend.WriteOptions{Mode: 0o644, MakeParents: true}); err != nil {
			return fmt.Errorf("fncall: write input file %s: %w", p, err)
		}
	}
	return nil
}

// errGoneBeforeStart marks a call that failed before its code started
// because its sandbox had died.
var errGoneBeforeStart = errors.New("the sandbox died before the call started")

// run runs one normalized request on sb.
func (s *Service) run(ctx context.Context, sb backend.Sandbox, req *Request, argv []string) (*Result, error) {
	if err := writeInputs(ctx, sb, req.Files); err != nil {
		// A dead sandbox's root is gone (failed precondition); other
		// errors (a bad path, say) are the call's and return at once.
		if errdefs.IsFailedPrecondition(err) && diedBy(sb, time.Second) {
			return nil, fmt.Errorf("%w: %w", errGoneBeforeStart, err)
		}
		return nil, err
	}
	var res *Result
	var er backend.ExecResult
	var err error
	if s.warmable(req) {
		res, er, err = s.execWarm(sb, req)
		if errors.Is(err, errRetired) {
			s.warm.drop(sb)
			res, er, err = s.execWarm(sb, req)
		}
		if err != nil {
			// The warm python failed before the call's code started (a
			// previous call may have killed it): the call runs cold.
			s.log.Warn("fncall: warm python failed; running cold", "sandbox", sb.ID(), "err", err)
			s.warm.drop(sb)
		}
	}
	if res == nil {
		if res, er, err = s.execCold(ctx, sb, req, argv); err != nil {
			return nil, err
		}
	}
	if peak, perr := sb.(backend.Resetter).MemoryPeak(); perr == nil {
		res.PeakMemory = peak
	}
	res.Verdict = verdict(req, er, res)
	res.Files, err = readOutputs(ctx, sb, req)
	return res, err
}

func (s *Service) warmable(req *Request) bool {
	return !s.cfg.ColdPython && req.Language == "python" && len(req.Stdin) <= maxWarmStdin
}

// execCold runs argv with the backend's Exec.
func (s *Service) execCold(ctx context.Context, sb backend.Sandbox, req *Request, argv []string) (*Result, backend.ExecResult, error) {
	keep := s.warm.keep(sb)
	cpu := watchCPU(sb.(backend.Resetter), s.log, req.CPULimit, keep)
	var out backend.OutputBuffers
	// Every call is followed by the sandbox's reset (release). Unless
	// output files are still to be read, the reset is done as the command
	// exits, by the same request: it kills what the call left running, so
	// the CPU watch need not.
	thenReset := len(req.OutputFiles) == 0
	spec := backend.ExecSpec{Argv: argv, Env: req.Env, Cwd: Workdir, Stdin: req.Stdin,
		Timeout: req.WallLimit, OutputLimit: req.OutputBytes, CPULimit: req.CPULimit,
		ThenReset: thenReset, ResetKeep: keep}
	er, err := sb.Exec(ctx, spec, out.Write)
	er.CPUTime = max(er.CPUTime, cpu.end(!thenReset || err != nil))
	if err != nil && !errdefs.IsNotFound(err) && !errdefs.IsPermissionDenied(err) {
		return nil, er, fmt.Errorf("fncall: %w", err)
	}
	res := &Result{Stdout: out.Stdout.Bytes(), Stderr: out.Stderr.Bytes(), ExitCode: er.ExitCode,
		Signal: er.Signal, CPUTime: er.CPUTime, WallTime: er.Duration}
	if err != nil {
		// The command could not start (no such binary): a runtime error
		// of the call, like exec's 127 in a shell.
		res.ExitCode, res.Stderr = 127, append(res.Stderr, err.Error()+"\n"...)
	}
	return res, er, nil
}

// execWarm runs a python call on sb's warm python.
func (s *Service) execWarm(sb backend.Sandbox, req *Request) (*Result, backend.ExecResult, error) {
	var er backend.ExecResult
	z, err := s.warm.get(sb, []string{defaultPath}, s.cfg.PythonPreload)
	if err != nil {
		return nil, er, err
	}
	rs := sb.(backend.Resetter)
	oomBefore, oomErr := rs.OOMKills()
	start := time.Now()
	zr := zygoteRequest{Src: req.Source, Stdin: req.Stdin, Env: envMap(req.Env),
		CPU: int64((req.CPULimit + time.Second - 1) / time.Second), Cap: req.OutputBytes, Wall: req.WallLimit.Seconds()}
	cpu := watchCPU(rs, s.log, req.CPULimit, []int{z.pid})
	r, err := z.call(zr)
	cpuUsed := cpu.end(true)
	if errors.Is(err, errNotStarted) {
		return nil, er, err
	}
	if err != nil {
		// The call killed its warm python (or the OOM killer chose it):
		// the call ran, so it ends as killed rather than running again.
		s.warm.drop(sb)
		r = zygoteReply{Code: -int(unix.SIGKILL), Err: []byte("corral: the call's python interpreter was killed: " + err.Error() + "\n")}
	}
	er = backend.ExecResult{ExitCode: r.Code, CPUTime: max(time.Duration(r.CPUNanos), cpuUsed), TimedOut: r.TimedOut,
		Truncated: r.Truncated, Duration: time.Since(start)}
	if r.Code < 0 {
		er.ExitCode, er.Signal = -1, -r.Code
	}
	if after, err := rs.OOMKills(); oomErr == nil && err == nil && after > oomBefore {
		er.OOMKilled = true
	}
	return &Result{Stdout: r.Out, Stderr: r.Err, ExitCode: er.ExitCode, Signal: er.Signal,
		CPUTime: er.CPUTime, WallTime: er.Duration}, er, nil
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// verdict applies the rules in order: time, memory, output, exit.
func verdict(req *Request, er backend.ExecResult, res *Result) Verdict {
	switch {
	case er.TimedOut || er.CPUTime >= req.CPULimit || er.Signal == int(unix.SIGXCPU):
		return VerdictTimeLimit
	case er.OOMKilled:
		return VerdictMemoryLimit
	case er.Truncated:
		return VerdictOutputLimit
	case res.ExitCode != 0 || res.Signal != 0:
		return VerdictRuntimeError
	}
	return VerdictOK
}

// readOutputs reads the requested output files; missing ones are left out.
// Their total is capped by the output limit.
func readOutputs(ctx context.Context, sb backend.Sandbox, req *Request) (map[string][]byte, error) {
	if len(req.OutputFiles) == 0 {
		return nil, nil
	}
	out := map[string][]byte{}
	budget := req.OutputBytes
	for _, p := range req.OutputFiles {
		if budget <= 0 {
			break
		}
		rc, err := sb.ReadFile(ctx, absPath(p), 0, budget)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("fncall: read output file %s: %w", p, err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("fncall: read output file %s: %w", p, err)
		}
		out[p] = b
		budget -= int64(len(b))
	}
	return out, nil
}
