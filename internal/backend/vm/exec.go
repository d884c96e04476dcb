package vm

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// maxStdin bounds a command's stdin: qemu-ga takes it whole, base64 in
// one JSON message.
const maxStdin = 8 << 20

// guestExec is the guest agent's view of one finished or running command.
type guestExec struct {
	Exited       bool   `json:"exited"`
	ExitCode     *int   `json:"exitcode"`
	Signal       *int   `json:"signal"`
	OutData      string `json:"out-data"`
	ErrData      string `json:"err-data"`
	OutTruncated bool   `json:"out-truncated"`
	ErrTruncated bool   `json:"err-truncated"`
}

// linuxArgv wraps a command for a Linux guest, whose qemu-ga knows no
// working directory, user or timeout: sh changes directory, coreutils'
// timeout (a process group leader, so one kill of the group ends every
// process of the command) enforces the timeout inside the guest, and
// setpriv or runuser switch the user.
func linuxArgv(spec backend.ExecSpec) []string {
	secs := int64(0)
	if spec.Timeout > 0 {
		secs = int64(math.Ceil(spec.Timeout.Seconds()))
	}
	var argv []string
	// qemu-ga runs commands in its own working directory, / (every exec
	// costs much under emulation: the shell only when it must cd).
	if cwd := spec.Cwd; cwd != "" && cwd != "/" {
		argv = []string{"/bin/sh", "-c", `cd "$1" 2>/dev/null || { echo "` + cwdMissing + `$1" >&2; exit 126; }; shift; exec "$@"`, "corral-exec", cwd}
	}
	if spec.OutputLimit > 0 {
		// One byte past the cap tells the host it was cut. The cap stays
		// outside timeout's process group, so that a timeout's kill does
		// not lose output still in the pipe.
		argv = append(argv, "/bin/sh", "-c", capScript, "corral-cap", strconv.FormatInt(spec.OutputLimit+1, 10))
	}
	argv = append(argv, "/usr/bin/timeout", "-s", "KILL", strconv.FormatInt(secs, 10))
	switch u := spec.User; {
	case u == "" || u == "root" || u == "0" || u == "0:0":
	case isNumericUser(u):
		uid, gid, ok := strings.Cut(u, ":")
		if !ok {
			gid = uid
		}
		argv = append(argv, "/usr/bin/setpriv", "--reuid="+uid, "--regid="+gid, "--clear-groups", "--")
	default:
		argv = append(argv, "/usr/sbin/runuser", "-u", u, "--")
	}
	return append(argv, spec.Argv...)
}

// capScript cuts the command's stdout in the guest (head ends the pipe,
// so a runaway writer dies of SIGPIPE as in other backends): qemu-ga would
// otherwise buffer 16 MiB of it, slowly under emulation, before the host
// cut it. The command's exit or signal (sh's 128+n) is passed on as the
// wrapper's own; stderr is cut on the host. The command runs by exec in a
// subshell, and the wrapper's own stderr is /dev/null, so that sh adds no
// "Killed" of its own to the command's stderr.
const capScript = `n=$1; shift
run() { ( exec "$@" 2>&5 3>&- 4>&- 5>&- ); echo $? >&3; }
exec 4>&1 5>&2 2>/dev/null
rc=$( { run "$@" | head -c "$n" >&4 4>&-; } 3>&1 )
[ "$rc" -gt 128 ] && kill -$((rc - 128)) $$
exit "$rc"`

// cwdMissing starts the wrapper's complaint that the working directory
// is not there (exit 126).
const cwdMissing = "corral-exec: no such working directory: "

// launchError maps a failure of linuxArgv's wrappers to start the command
// to the error kinds of other backends: a missing cwd is an invalid
// argument, a missing or non-executable program not found or permission
// denied, an unknown user not found. A command's own exit is never one of
// these: each needs the wrapper's exit code and its message first.
func launchError(spec backend.ExecSpec, code int, stderr []byte) error {
	msg := strings.TrimSpace(string(stderr))
	switch {
	case code == 126 && strings.HasPrefix(msg, cwdMissing):
		return errdefs.InvalidArgument("exec.cwd: %q is not a directory in the sandbox", spec.Cwd)
	case code == 1 && strings.HasPrefix(msg, "runuser: user ") && strings.Contains(msg, "does not exist"):
		return errdefs.NotFound("exec.user: %s", msg)
	case code != 126 && code != 127:
		return nil
	}
	for _, p := range []string{"/usr/bin/timeout: failed to run command", "runuser: failed to execute", "setpriv: failed to execute"} {
		if strings.HasPrefix(msg, p) {
			if strings.Contains(msg, "Permission denied") {
				return errdefs.PermissionDenied("exec: %s: %s", spec.Argv[0], msg)
			}
			return errdefs.NotFound("exec: %s: %s", spec.Argv[0], msg)
		}
	}
	return nil
}

func isNumericUser(u string) bool {
	for _, p := range strings.SplitN(u, ":", 2) {
		if _, err := strconv.ParseUint(p, 10, 32); err != nil {
			return false
		}
	}
	return true
}

// Interactive implements backend.Interactive: through corral-agent Exec
// honours PTY and Started; qemu-ga guests refuse both.
func (s *sandbox) Interactive() {}

// Exec implements backend.Sandbox through guest-exec: the command's
// output is captured by the guest agent and arrives when it has exited
// (the protocol does not stream).
func (s *sandbox) Exec(ctx context.Context, spec backend.ExecSpec, out backend.OutputFunc) (backend.ExecResult, error) {
	var res backend.ExecResult
	if err := s.Serving(); err != nil {
		return res, err
	}
	if s.agent != nil {
		return s.agentExec(ctx, spec, out)
	}
	if spec.PTY != nil {
		return res, errdefs.NotSupported("exec.pty: the vm backend's guest agent has no terminals (an image with corral-agent has)")
	}
	if spec.Started != nil {
		return res, errdefs.NotSupported("long-running processes: the vm backend's guest agent returns a command only once it exited (an image with corral-agent streams)")
	}
	if len(spec.Argv) == 0 {
		return res, errdefs.InvalidArgument("exec.argv: required")
	}
	stdin := spec.Stdin
	if spec.StdinReader != nil {
		b, err := io.ReadAll(io.LimitReader(spec.StdinReader, maxStdin+1))
		if err != nil {
			return res, fmt.Errorf("sandbox %s: exec: read stdin: %w", s.m.id, err)
		}
		stdin = b
	}
	if len(stdin) > maxStdin {
		return res, errdefs.InvalidArgument("exec.stdin: %d bytes is over the vm backend's limit of %d MiB (the guest agent takes stdin whole)", len(stdin), maxStdin>>20)
	}
	argv := spec.Argv
	if s.m.Linux {
		argv = linuxArgv(spec)
	}
	args := map[string]any{"path": argv[0], "arg": argv[1:], "capture-output": true}
	if len(spec.Env) > 0 {
		args["env"] = spec.Env
	}
	if len(stdin) > 0 {
		args["input-data"] = base64.StdEncoding.EncodeToString(stdin)
	}
	start := time.Now()
	var started struct {
		PID int `json:"pid"`
	}
	if err := s.qga.call(ctx, "guest-exec", args, &started); err != nil {
		if qe, ok := err.(*qgaError); ok && strings.Contains(qe.Desc, "No such file or directory") {
			return res, errdefs.NotFound("exec: %s: %s", spec.Argv[0], qe.Desc)
		}
		return res, fmt.Errorf("sandbox %s: exec %s: %w", s.m.id, spec.Argv[0], err)
	}
	st, err := s.waitExec(ctx, started.PID, spec.Timeout)
	res.Duration = time.Since(start)
	if err != nil {
		// A cancelled call killed the command, as a timeout does.
		res.TimedOut = ctx.Err() != nil
		return res, fmt.Errorf("sandbox %s: exec %s: %w", s.m.id, spec.Argv[0], err)
	}
	stdout, err1 := base64.StdEncoding.DecodeString(st.OutData)
	stderr, err2 := base64.StdEncoding.DecodeString(st.ErrData)
	if err := errors.Join(err1, err2); err != nil {
		return res, fmt.Errorf("sandbox %s: exec: decode output: %w", s.m.id, err)
	}
	switch {
	case st.Signal != nil:
		res.ExitCode, res.Signal = -1, *st.Signal
	case st.ExitCode != nil:
		res.ExitCode = *st.ExitCode
	}
	if s.m.Linux {
		if err := launchError(spec, res.ExitCode, stderr); err != nil {
			return res, err
		}
		// timeout killed its group with SIGKILL, itself included (the
		// agent reports the signal, or a shell's 128+9).
		if spec.Timeout > 0 && (res.Signal == 9 || res.ExitCode == 128+9) && res.Duration >= spec.Timeout-time.Second {
			res.ExitCode, res.Signal, res.TimedOut = -1, 9, true
		}
		if res.Signal == 9 && !res.TimedOut {
			res.OOMKilled = s.oomKilledSince(ctx)
		}
	}
	res.Truncated = st.OutTruncated || st.ErrTruncated
	remaining := spec.OutputLimit // 0: no cap
	for _, o := range []struct {
		s backend.Stream
		b []byte
	}{{backend.Stdout, stdout}, {backend.Stderr, stderr}} {
		b := o.b
		if spec.OutputLimit > 0 {
			if int64(len(b)) > remaining {
				b, res.Truncated = b[:remaining], true
			}
			remaining -= int64(len(b))
		}
		if len(b) > 0 {
			if err := out(o.s, b); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// waitExec polls guest-exec-status until the command exited. Past its
// timeout (with a grace for the guest's own timer) or when ctx ends, the
// command's process group is killed.
func (s *sandbox) waitExec(ctx context.Context, pid int, timeout time.Duration) (guestExec, error) {
	var st guestExec
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout + 10*time.Second)
		defer t.Stop()
		deadline = t.C
	}
	wait := 5 * time.Millisecond
	for {
		if err := s.qga.call(ctx, "guest-exec-status", map[string]any{"pid": pid}, &st); err != nil {
			if ctx.Err() != nil {
				s.killGuest(pid)
				return st, ctx.Err()
			}
			return st, err
		}
		if st.Exited {
			return st, nil
		}
		select {
		case <-ctx.Done():
			s.killGuest(pid)
			return st, ctx.Err()
		case <-deadline:
			s.killGuest(pid)
			deadline = nil
		case <-s.Done():
			return st, errdefs.FailedPrecondition("sandbox %s: the vm ended while the command ran", s.m.id)
		case <-time.After(wait):
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// killScript kills a process tree, children first, and each process
// group led by one of its processes (the wrapper's timeout leads the
// command's, which holds children that left the tree).
const killScript = `k() { for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do k "$c"; done; kill -KILL -- -"$1" 2>/dev/null; kill -KILL "$1" 2>/dev/null; }; k "$1"`

// killGuest kills a command's processes (Linux guests), detached from the
// caller's context.
func (s *sandbox) killGuest(pid int) {
	if !s.m.Linux {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.qga.call(ctx, "guest-exec", map[string]any{"path": "/bin/sh", "arg": []string{"-c", killScript, "corral-kill", strconv.Itoa(pid)}}, nil)
}

// oomKilledSince says whether the guest's OOM killer has killed a
// process since the last look (at boot, recovery, or the last SIGKILL):
// qemu-ga reports only the signal. Two commands killed at once may both
// be flagged.
func (s *sandbox) oomKilledSince(ctx context.Context) bool {
	n, err := s.oomKills(ctx)
	if err != nil {
		return false
	}
	return n > s.oomSeen.Swap(n)
}

// oomKills reads the guest kernel's count of OOM kills.
func (s *sandbox) oomKills(ctx context.Context) (int64, error) {
	out, err := s.sh(ctx, `exec sed -n 's/^oom_kill //p' /proc/vmstat`)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
}

// sh runs a script in a Linux guest and returns its stdout; a non-zero
// exit is an error carrying stderr.
func (s *sandbox) sh(ctx context.Context, script string, args ...string) ([]byte, error) {
	if !s.m.Linux {
		return nil, errdefs.NotSupported("sandbox %s: this operation needs a Linux guest (the guest agent reports %q)", s.m.id, s.m.OS)
	}
	var out, errb bytes.Buffer
	res, err := s.Exec(ctx, backend.ExecSpec{Argv: append([]string{"/bin/sh", "-c", script, "corral"}, args...),
		Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}, Timeout: time.Minute},
		func(st backend.Stream, p []byte) error {
			if st == backend.Stdout {
				out.Write(p)
			} else {
				errb.Write(p)
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	if res.TimedOut {
		return nil, errdefs.Unavailable("guest command timed out after a minute")
	}
	if res.ExitCode != 0 {
		return nil, fileError(strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// fileError maps a guest's error text to the error vocabulary.
func fileError(msg string) error {
	switch {
	case strings.Contains(msg, "No such file or directory"), strings.Contains(msg, "Directory nonexistent"):
		return errdefs.NotFound("%s", msg)
	case strings.Contains(msg, "Permission denied"):
		return errdefs.PermissionDenied("%s", msg)
	case strings.Contains(msg, "File exists"):
		return errdefs.AlreadyExists("%s", msg)
	case strings.Contains(msg, "Not a directory"), strings.Contains(msg, "Is a directory"),
		strings.Contains(msg, "Directory not empty"):
		return errdefs.FailedPrecondition("%s", msg)
	case strings.Contains(msg, "No space left"):
		return errdefs.ResourceExhausted("%s", msg)
	}
	return errors.New(msg)
}
