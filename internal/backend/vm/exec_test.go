package vm

import (
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
		{127, "corral-cap: 3: no-such-binary: not found\n", errdefs.IsNotFound},
		{126, "corral-cap: 3: /etc/passwd: Permission denied\n", errdefs.IsPermissionDenied},
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
