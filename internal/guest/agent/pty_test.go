package agent

import (
	"context"
	"net"
	"os"
	"os/signal"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/backend/backendtest"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentclient"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// localAgent serves the node's client from this process over a pipe: the
// agent's real exec code on the host's devpts, without booting a guest.
// maxVersion plays an agent of that protocol version.
func localAgent(t *testing.T, maxVersion int) *agentclient.Client {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the agent's exec needs root (it forks with credentials)")
	}
	const secret = "0123456789abcdef0123456789abcdef"
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, unix.SIGCHLD)
	s := &server{secret: secret, procs: newReaper(), maxVersion: maxVersion}
	go s.procs.run(sigs)
	agentEnd, nodeEnd := net.Pipe()
	go s.session(agentEnd)
	sess, err := agentclient.NewSession(nodeEnd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sess.Close()
		signal.Stop(sigs)
		close(sigs)
	})
	return agentclient.New(func(context.Context) (*yamux.Session, error) { return sess, nil },
		func() string { return secret })
}

func TestExecOnTerminal(t *testing.T) {
	c := localAgent(t, agentproto.Version)
	backendtest.CheckTerminal(t, func(ctx context.Context, spec backend.ExecSpec, out backend.OutputFunc) (backend.ExecResult, error) {
		return c.Exec(ctx, spec, out, nil)
	}, 30*time.Second)
}

// TestOlderAgentRefusesTerminal: an agent of version 2 (no terminals)
// still serves plain execs, and the node's error for a terminal names the
// missing capability.
func TestOlderAgentRefusesTerminal(t *testing.T) {
	c := localAgent(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	collect := func(_ backend.Stream, p []byte) error { out.Write(p); return nil }
	res, err := c.Exec(ctx, backend.ExecSpec{Argv: []string{"/bin/echo", "plain"}, Cwd: "/"}, collect, nil)
	if err != nil || res.ExitCode != 0 || out.String() != "plain\n" {
		t.Fatalf("plain exec on a version-2 agent: %+v %q %v", res, out.String(), err)
	}
	_, err = c.Exec(ctx, backend.ExecSpec{Argv: []string{"/bin/sh"}, Cwd: "/", PTY: &backend.TermSize{Cols: 80, Rows: 24}}, collect, nil)
	if !errdefs.IsNotSupported(err) || !strings.Contains(err.Error(), "exec on a terminal (pty)") || !strings.Contains(err.Error(), "version 3") {
		t.Fatalf("terminal exec on a version-2 agent: %v, want not supported naming the capability and version", err)
	}
}
