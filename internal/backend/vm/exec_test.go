package vm

import (
	"bytes"
	"os/exec"
	"syscall"
	"testing"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// TestLaunchError: the wrappers' failures to start a command map to the
// error kinds of the other backends, and a command's own exit with the
// same code or words stays a plain result.
func TestLaunchError(t *testing.T) {
	spec := backend.ExecSpec{Argv: []string{"prog"}, Cwd: "/nope"}
	for _, c := range []struct {
		code   int
		stderr string
		is     func(error) bool
	}{
		{126, cwdMissing + "/nope\n", errdefs.IsInvalidArgument},
		{127, "/usr/bin/timeout: failed to run command 'prog': No such file or directory\n", errdefs.IsNotFound},
		{126, "/usr/bin/timeout: failed to run command '/etc/passwd': Permission denied\n", errdefs.IsPermissionDenied},
		{127, "runuser: failed to execute prog: No such file or directory\n", errdefs.IsNotFound},
		{126, "setpriv: failed to execute prog: Permission denied\n", errdefs.IsPermissionDenied},
		{1, "runuser: user nobody-here does not exist or the user entry does not contain all the required fields\n", errdefs.IsNotFound},
	} {
		if err := launchError(spec, c.code, []byte(c.stderr)); !c.is(err) {
			t.Errorf("exit %d %q: %v", c.code, c.stderr, err)
		}
	}
	for _, c := range []struct {
		code   int
		stderr string
	}{
		{0, cwdMissing + "/nope"},
		{1, "/usr/bin/timeout: failed to run command 'x': No such file or directory"},
		{126, "sh: 1: ./x: Permission denied"},
		{127, "prog: runuser: user x does not exist"},
		{2, "runuser: user x does not exist"},
	} {
		if err := launchError(spec, c.code, []byte(c.stderr)); err != nil {
			t.Errorf("a command's own exit %d %q became %v", c.code, c.stderr, err)
		}
	}
}

// TestCapScript runs the guest's output-cap wrapper with the host's sh:
// the writer dies of SIGPIPE one byte past the cap, exit codes and
// signals pass through, and the wrapper adds nothing to stderr.
func TestCapScript(t *testing.T) {
	for _, c := range []struct {
		argv   []string
		out    int
		code   int
		signal syscall.Signal
		stderr string
	}{
		{[]string{"yes"}, 101, -1, syscall.SIGPIPE, ""},
		{[]string{"/bin/sh", "-c", "echo out; echo err >&2; exit 7"}, 4, 7, 0, "err\n"},
		{[]string{"/bin/sh", "-c", "kill -KILL $$"}, 0, -1, syscall.SIGKILL, ""},
	} {
		cmd := exec.Command("/bin/sh", append([]string{"-c", capScript, "corral-cap", "101"}, c.argv...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		_ = cmd.Run()
		ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
		code, sig := ws.ExitStatus(), syscall.Signal(0)
		if ws.Signaled() {
			sig = ws.Signal()
		}
		if out.Len() != c.out || code != c.code || sig != c.signal || errb.String() != c.stderr {
			t.Errorf("%q: %d bytes, exit %d, signal %v, stderr %q; want %d, %d, %v, %q",
				c.argv, out.Len(), code, sig, errb.String(), c.out, c.code, c.signal, c.stderr)
		}
	}
}
