package microvm

import (
	"context"
	"errors"
	"fmt"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentclient"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// Interactive implements backend.Interactive: the agent runs PTY execs on
// a terminal of the guest's and hands out a handle once they started.
func (s *sandbox) Interactive() {}

// Exec implements backend.Sandbox through the agent (internal/guest/
// agentclient), which streams the output, stdin and the exit.
func (s *sandbox) Exec(ctx context.Context, spec backend.ExecSpec, out backend.OutputFunc) (backend.ExecResult, error) {
	if err := s.Serving(); err != nil {
		return backend.ExecResult{}, err
	}
	if len(spec.Argv) == 0 {
		return backend.ExecResult{}, errdefs.InvalidArgument("sandbox %s: exec: argv must not be empty", s.m.id)
	}
	name := spec.Argv[0]
	if spec.Shell {
		// The initramfs's busybox, read-only at ShellPath: replacing the
		// image's /bin/sh does not hijack the next shell command.
		spec.Argv = append([]string{agentproto.ShellPath}, spec.Argv[1:]...)
	}
	res, err := s.agent.Exec(ctx, spec, out, s.Done())
	switch {
	case errors.Is(err, agentclient.ErrEnded):
		return res, fmt.Errorf("sandbox %s: exec %q: %w: %s", s.m.id, name, err, s.ExitReason())
	case err != nil:
		return res, fmt.Errorf("sandbox %s: exec %q: %w", s.m.id, name, err)
	}
	return res, nil
}
