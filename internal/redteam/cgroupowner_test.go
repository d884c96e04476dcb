package redteam

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// The rows of this file are an operator's mistake rather than an agent's
// attempt (issue 21, finding 12): a second daemon, with a data dir of its
// own, started on the cgroup parent of a live one swept 1,281 cgroups of
// the first daemon's sandboxes. They are host-side and per node; they run
// once, in the container column.

// TestNodeCgroupParentOwned: while daemon A serves a sandbox, daemon B
// (its own data dir) is started on A's cgroup parent. B must refuse to
// start, naming A's data dir, and A's sandbox must keep running.
func TestNodeCgroupParentOwned(t *testing.T) {
	const backend = "container"
	a := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, a.Client, client.CreateOptions{Backend: backend})
	testenv.Sh(t, sb, "sleep 1000 >/dev/null 2>&1 &")
	b, err := testenv.Start(slog.New(slog.DiscardHandler),
		func(c *server.Config) { c.CgroupParent = a.Config.CgroupParent })
	if err == nil {
		// Before the fix: B started, and its sweep took A's sandbox.
		_ = b.Stop()
		os.RemoveAll(b.Config.DataDir)
	}
	res, runErr := sb.Run(context.Background(), client.Command{Shell: "echo alive"})
	alive := runErr == nil && strings.TrimSpace(string(res.Stdout)) == "alive"
	named := err != nil && strings.Contains(err.Error(), a.Config.DataDir)
	judgeNode(t, backend, []Result{check("node/cgroup-parent-second-daemon", named && alive,
		"second daemon on parent %s: %v; first daemon's sandbox afterwards: %v %q", a.Config.CgroupParent, err, runErr, stdout(res))})
}

// TestNodeCgroupForeignUntouched: a parent holds a cgroup no record or
// run dir of the starting daemon names (a dead daemon's). The daemon
// takes the parent over and its start-up sweep leaves that cgroup alone.
func TestNodeCgroupForeignUntouched(t *testing.T) {
	const backend = "container"
	testenv.RequireRoot(t)
	parent := testenv.UniqueName("corral-test")
	m, err := cgroup.NewManager(parent)
	if err != nil {
		t.Skipf("cgroups: %v", err)
	}
	foreign := testenv.UniqueName("foreign")
	g, err := m.Create(foreign, cgroup.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	srv := testenv.StartServer(t, func(c *server.Config) { c.CgroupParent = parent })
	// Before the server's own cleanup, which wants an empty parent.
	t.Cleanup(func() { _ = g.Remove(context.Background()) })
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend})
	out := testenv.Sh(t, sb, "echo alive")
	judgeNode(t, backend, []Result{check("node/cgroup-foreign-untouched", g.Exists() && out == "alive\n",
		"cgroup %s/%s after the daemon's start on that parent: exists %v; the daemon serves: %q", parent, foreign, g.Exists(), out)})
}

func stdout(r *client.Result) string {
	if r == nil {
		return ""
	}
	return strings.TrimSpace(string(r.Stdout))
}
