// Package initproc is the body of cmd/corral-init, PID 1 of every container
// sandbox: it builds the sandbox's root filesystem inside its own mount
// namespace, drops privileges, then serves ping/exec/kill requests from the
// node on the inherited control socket and reaps every process. It owns
// nothing on the host. It must stay small and quick to start: it imports only
// the standard library, golang.org/x/sys/unix, initproto and the seccomp
// package — never protobuf, cobra, net, the backend or node packages.
package initproc

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"

	"github.com/corral-dev/corral/internal/runtime/initproto"
	"golang.org/x/sys/unix"
)

// Main runs init and never returns while the sandbox lives. A setup failure
// is reported on the setup socket, then init exits (the node cleans up).
func Main() {
	runtime.GOMAXPROCS(1)
	debug.SetGCPercent(20)
	debug.SetMemoryLimit(4 << 20)
	// Protect the setup from being inspected before hardening is complete.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)

	setup, err := initproto.NewConn(initproto.SetupFd, "setup")
	if err != nil {
		fail(nil, "setup socket: %v", err)
	}
	var cfg initproto.Config
	if _, err := setup.Recv(&cfg); err != nil {
		fail(setup, "read config: %v", err)
	}
	if cfg.Version != initproto.Version {
		fail(setup, "config: %v: got %d, want %d", initproto.ErrVersion, cfg.Version, initproto.Version)
	}
	// Signals are caught (not ignored, which children would inherit) so
	// that a process inside cannot make PID 1 exit with SIGTERM & co.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs)

	if err := buildRoot(&cfg); err != nil {
		fail(setup, "%v", err)
	}
	if err := harden(&cfg); err != nil {
		fail(setup, "harden: %v", err)
	}
	srv, err := newServer()
	if err != nil {
		fail(setup, "%v", err)
	}
	if err := setup.Send(initproto.Reply{Op: initproto.OpReady, Pid: os.Getpid()}); err != nil {
		fail(nil, "send ready: %v", err)
	}
	setup.Close()
	go srv.reap(sigs)
	srv.serve()
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
