package redteam

import (
	"net"
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
	"github.com/corral-dev/corral/internal/testenv/accept"
	"golang.org/x/sys/unix"
)

// TestAbstractSocketOutsideDomain: a process outside the sandbox listening
// on an abstract unix name in the sandbox's own network namespace (as a
// harness helper sharing it would) is out of the sandbox's reach. The
// network namespace cannot separate them; init's Landlock scope does.
func TestAbstractSocketOutsideDomain(t *testing.T) {
	testenv.RequireRoot(t)
	srv, _ := startServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Image: "busybox"})
	installProbe(t, sb)
	pids := hostPids(srv.Config.CgroupParent, sb.ID())
	if len(pids) == 0 {
		t.Fatal("no host process in the sandbox's cgroup")
	}
	name := testenv.UniqueName("corral-redteam-abstract")
	ln := listenAbstractIn(t, pids[0], name)
	defer ln.Close()
	accept.Each(ln, func(c net.Conn) { c.Close() })
	results := runProbe(t, sb, nil, "connect", "@"+name)
	if len(results) != 1 {
		t.Fatalf("probe: want one result, got %+v", results)
	}
	judge(t, "container", results, "forge/connect")
	if results[0].Errno != "EPERM" {
		t.Errorf("connect to @%s from inside: %+v, want EPERM from the Landlock scope", name, results[0])
	}
}

// listenAbstractIn listens on the abstract unix name in the network
// namespace of process pid, from a thread that is thrown away afterwards.
func listenAbstractIn(t *testing.T, pid int, name string) net.Listener {
	t.Helper()
	type result struct {
		ln  net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread leaves our netns
		ns, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
		if err != nil {
			done <- result{err: err}
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- result{err: err}
			return
		}
		ln, err := net.Listen("unix", "@"+name)
		done <- result{ln, err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatalf("listen on @%s in the sandbox's netns: %v", name, r.err)
	}
	return r.ln
}
