// Package initproc is the body of cmd/corral-init, PID 1 of every container
// sandbox: it builds the sandbox's root filesystem inside its own mount
// namespace, drops privileges, then serves ping/exec/kill requests from the
// node on the inherited control socket and reaps every process — or, given
// the node's corral-initstub (stub.go), execs that as PID 1 and serves the
// requests it hands over, as its on-demand server. It owns
// nothing on the host. It must stay small and quick to start: it imports only
// the standard library, golang.org/x/sys/unix, errdefs, guest/initproto,
// runtime/seccomp, runtime/spare and guest/exec (with guest/passwd) — never
// protobuf, cobra, net, the backend or node packages (internal/deptest).
package initproc

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"

	"github.com/corral-dev/corral/internal/guest/initproto"
	"github.com/corral-dev/corral/internal/runtime/spare"
	"golang.org/x/sys/unix"
)

// Main runs init and never returns while the sandbox lives. It runs in two
// stages in one process: the setup stage (privileged) builds the root
// filesystem, hardens its one thread and re-executes itself as the serving
// stage, which reports ready and serves the node. A setup failure is
// reported on the setup socket, then init exits (the node cleans up).
func Main() {
	// One P is plenty for init and keeps its threads few. The GC keeps its
	// defaults: init's heap stays far below the 4 MiB minimum goal, so no
	// collection runs during setup (a lower GOGC or a memory limit made init
	// spend a fifth of each create collecting).
	runtime.GOMAXPROCS(1)
	// Nothing may inspect init: not during setup, and not after the re-exec
	// (execve makes a process dumpable again).
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	if len(os.Args) > 2 && os.Args[1] == serveStage && os.Args[2] == childMode {
		serveChild()
		return
	}
	if len(os.Args) > 1 && os.Args[1] == serveStage {
		serveMain()
		return
	}
	setupMain()
}

func setupMain() {
	// Only stdio, the control listener and the setup socket are meant to
	// be here: any other fd the node's process had open without
	// close-on-exec must not reach the sandbox.
	if err := unix.CloseRange(initproto.SetupFd+1, ^uint(0), 0); err != nil {
		fail(nil, "close inherited fds: %v", err)
	}
	setup, err := initproto.NewConn(initproto.SetupFd, "setup")
	if err != nil {
		fail(nil, "setup socket: %v", err)
	}
	var cfg initproto.Config
	mounts, err := setup.Recv(&cfg)
	if err != nil {
		fail(setup, "read config: %v", err)
	}
	if cfg.Stub && cfg.Pool {
		fail(setup, "config: a pooled sandbox keeps the Go init as PID 1, not the stub")
	}
	want := cfg.Mounts
	if cfg.Stub {
		want++
	}
	if len(mounts) != want {
		fail(setup, "config: got %d fds, want %d", len(mounts), want)
	}
	stub := -1
	if cfg.Stub {
		stub, mounts = ownCopy(setup, mounts[cfg.Mounts]), mounts[:cfg.Mounts]
	}
	if cfg.Version != initproto.Version {
		fail(setup, "config: %v: got %d, want %d", initproto.ErrVersion, cfg.Version, initproto.Version)
	}
	// The binary is re-executed after pivot_root, when its path is gone.
	exe, err := unix.Open("/proc/self/exe", unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		fail(setup, "open own binary: %v", err)
	}
	build := buildRoot
	if cfg.Pool {
		build = buildPoolRoot
	}
	if err := build(&cfg, mounts); err != nil {
		fail(setup, "%v", err)
	}
	err = hardenAndExec(&cfg, exe, stub)
	fail(setup, "harden: %v", err)
}

func serveMain() {
	setup, err := initproto.NewConn(initproto.SetupFd, "setup")
	if err != nil {
		fail(nil, "setup socket: %v", err)
	}
	// Signals are caught (not ignored, which children would inherit) so
	// that a process inside cannot make PID 1 exit with SIGTERM & co.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs)
	spare.Threads(spareThreads)
	srv, err := newServer()
	if err == nil {
		err = srv.listen()
	}
	if err != nil {
		fail(setup, "%v", err)
	}
	if len(os.Args) > 2 && os.Args[2] == poolMode {
		if srv.pool, err = loadPool(); err != nil {
			fail(setup, "%v", err)
		}
	}
	if err := setup.Send(initproto.Reply{Op: initproto.OpReady, Pid: os.Getpid()}); err != nil {
		fail(nil, "send ready: %v", err)
	}
	setup.Close()
	go srv.reap(sigs)
	srv.serve()
}

// ownCopy reopens the node's fd of the stub binary as a description of
// init's own (O_PATH), so that nothing in the sandbox shares one with the
// node, and closes the node's.
func ownCopy(setup *initproto.Conn, fd int) int {
	own, err := unix.Open("/proc/self/fd/"+strconv.Itoa(fd), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		fail(setup, "open the stub: %v", err)
	}
	unix.Close(fd)
	return own
}

// fail reports a setup error to the node and exits.
func fail(setup *initproto.Conn, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintln(os.Stderr, "corral-init:", msg)
	if setup != nil {
		_ = setup.Send(initproto.Reply{Op: initproto.OpError, Error: msg, Class: initproto.ClassInternal})
	}
	os.Exit(1)
}

// spareThreads is how many OS threads init makes before serving. Go keeps
// idle threads and reuses them, so init never needs a new one while a fork
// bomb holds the sandbox's pids limit (a failed thread creation is fatal to
// a Go program). Every thread is a host PID of an idle sandbox: with one P
// from the start (GOMAXPROCS=1 in init's environment) the runtime keeps
// about five of its own (sysmon, the signal receiver, the poller, idle
// ones), and two spares on top held the pids-limit fork bomb (an idle init
// had 11 threads with six).
const spareThreads = 2
