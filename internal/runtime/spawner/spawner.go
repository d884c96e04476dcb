// Package spawner clones container sandboxes' inits for the node: the
// clone itself (Start, shared with the node's direct path) and the
// spawner, a small long-lived process (corral-init run with Arg) that the
// node starts at start-up and asks over a socketpair to clone each init.
//
// Why a separate process: a clone with CLONE_NEWUSER cannot share the
// parent's memory (the child waits for the parent to write its id maps),
// so cloning from the daemon copies the daemon's page tables and makes
// every later write of the daemon take a copy-on-write fault. The
// spawner's few MiB cost little to copy.
//
// The spawner is the inits' parent and reaps them; the node watches each
// through the pidfd it gets back. It runs on the host, in the node's own
// cgroups and namespaces, reads requests only from the node's end of its
// socketpair, and exits when that end closes. It imports initproto (the
// message framing) and x/sys/unix; never the node, backends or anything
// that links network code into the static init.
package spawner

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"

	"github.com/corral-dev/corral/internal/guest/initproto"
	"golang.org/x/sys/unix"
)

// Arg is corral-init's only argument in spawner mode.
const Arg = "spawner"

// ControlFd is the spawner's end of the node's socketpair.
const ControlFd = 3

// Version is the request protocol's version.
const Version = 1

// Request asks for one init. Its fds, in order: the reply socket, the
// working directory (init attaches the rootfs there), stderr, the control
// listener, the setup socket, init's binary, then the v2 cgroup directory
// if Cgroup2, the network namespace if Netns, and Tasks v1 tasks files.
type Request struct {
	Version int
	// Flags are the namespaces besides the user namespace; without
	// CLONE_NEWNET when Netns is sent.
	Flags      uintptr
	Host, Size uint32
	Cgroup2    bool
	Netns      bool
	Tasks      int
}

// Reply answers a Request on its reply socket, with the pidfd on success.
type Reply struct {
	Pid   int
	Error string `json:",omitempty"`
	// Errno is the failure's errno, if it had one (EAGAIN: no PID left).
	Errno int `json:",omitempty"`
}

const fixedFds = 6 // reply, dir, stderr, listener, setup, bin

// Requested reports whether this corral-init was started as the spawner.
func Requested() bool { return len(os.Args) == 2 && os.Args[1] == Arg }

// Main serves requests on ControlFd until the node closes its end.
func Main() {
	// The main thread stays with this goroutine, so that no request runs
	// on it: a request's thread enters a sandbox's cgroups and is thrown
	// away afterwards, which Go cannot do with the main thread.
	runtime.LockOSThread()
	conn, err := initproto.NewConn(ControlFd, "spawner")
	if err != nil {
		fatal(err)
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		fatal(err)
	}
	go reap()
	for {
		var req Request
		fds, err := conn.Recv(&req)
		if errors.Is(err, io.EOF) {
			os.Exit(0)
		}
		var errno syscall.Errno
		if errors.As(err, &errno) {
			fatal(err)
		}
		if err != nil {
			// A malformed request: its fds are closed, so the node's
			// reply socket reads EOF.
			fmt.Fprintln(os.Stderr, "corral spawner:", err)
			continue
		}
		go serve(int(null.Fd()), req, fds)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "corral spawner:", err)
	os.Exit(1)
}

// reap waits for exited inits (the node has their pidfds).
func reap() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	for range ch {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if pid <= 0 && err != unix.EINTR {
				break
			}
		}
	}
}

func serve(null int, req Request, fds []int) {
	if len(fds) < 1 {
		return
	}
	defer closeAll(fds[1:])
	reply, err := initproto.NewConn(fds[0], "reply") // owns fds[0] now
	if err != nil {
		return
	}
	defer reply.Close()
	fds = fds[1:]
	type result struct {
		pid, pidfd int
		err        error
	}
	res := make(chan result, 1)
	go func() {
		// Never unlocked: Go ends the thread with the goroutine, and
		// with it the cgroups, directory and namespace it took on.
		runtime.LockOSThread()
		pid, pidfd, err := spawn(null, req, fds)
		res <- result{pid, pidfd, err}
	}()
	r := <-res
	if r.err != nil {
		rep := Reply{Error: r.err.Error()}
		var errno syscall.Errno
		if errors.As(r.err, &errno) {
			rep.Errno = int(errno)
		}
		_ = reply.Send(rep)
		return
	}
	defer unix.Close(r.pidfd)
	if err := reply.Send(Reply{Pid: r.pid}, r.pidfd); err != nil {
		// The node is gone or gave up: nobody will watch this init.
		_ = unix.PidfdSendSignal(r.pidfd, unix.SIGKILL, nil, 0)
	}
}

// spawn prepares the calling (locked, disposable) thread as the request
// says and clones init from it.
func spawn(null int, req Request, fds []int) (pid, pidfd int, err error) {
	if req.Version != Version {
		return 0, 0, fmt.Errorf("spawner: request version %d, want %d", req.Version, Version)
	}
	want := fixedFds - 1 + btoi(req.Cgroup2) + btoi(req.Netns) + req.Tasks
	if req.Tasks < 0 || len(fds) != want {
		return 0, 0, fmt.Errorf("spawner: request with %d fds, want %d", len(fds), want)
	}
	if unix.Gettid() == unix.Getpid() {
		return 0, 0, errors.New("spawner: request on the main thread")
	}
	dir, stderr, listener, setup, bin := fds[0], fds[1], fds[2], fds[3], fds[4]
	rest := fds[5:]
	cgfd := -1
	if req.Cgroup2 {
		cgfd, rest = rest[0], rest[1:]
	}
	flags := req.Flags
	if req.Netns {
		if err := unix.Setns(rest[0], unix.CLONE_NEWNET); err != nil {
			return 0, 0, fmt.Errorf("start init: enter sandbox netns: %w", err)
		}
		flags &^= unix.CLONE_NEWNET
		rest = rest[1:]
	}
	tid := []byte(strconv.Itoa(unix.Gettid()))
	for _, fd := range rest {
		if _, err := unix.Write(fd, tid); err != nil {
			return 0, 0, fmt.Errorf("start init: enter v1 cgroup: %w", err)
		}
	}
	// The child inherits this thread's working directory, copied into its
	// mount namespace; CLONE_FS unshared first, so that no other thread's
	// directory changes.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return 0, 0, fmt.Errorf("start init: unshare fs: %w", err)
	}
	if err := unix.Fchdir(dir); err != nil {
		return 0, 0, fmt.Errorf("start init: chdir: %w", err)
	}
	return Start(Clone{
		Flags: flags, Host: req.Host, Size: req.Size, CgroupFD: cgfd,
		Stdin: null, Stderr: stderr, Listener: listener, Setup: setup, Bin: bin,
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
