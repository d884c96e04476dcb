// Package launch is the node side of a container sandbox's init: it binds the
// control socket, starts corral-init inside fresh namespaces and the
// sandbox's cgroups, watches it through a pidfd and talks to it with the
// initproto protocol. It never sets up namespaces in the calling (daemon)
// process; the clones themselves come from a spawner process it starts
// (Spawner), or from the node when none is running. It imports the runtime
// packages, guest/initproto, errdefs and x/sys/unix; never the backend,
// node or API layers.
package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/initproto"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/runtime/osthread"
	"github.com/corral-dev/corral/internal/runtime/spawner"
	"github.com/corral-dev/corral/internal/runtime/userns"
	"golang.org/x/sys/unix"
)

// cloneFlags are the namespaces of a sandbox. CLONE_NEWCGROUP is taken while
// the child already sits in its cgroups, so its cgroup root is its own.
const cloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// Listen binds the SOCK_SEQPACKET control socket at path (its directory must
// be private to root) and returns the listening socket for init.
func Listen(path string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("control socket: bind %s: %w", path, err)
	}
	if err := unix.Listen(fd, 64); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("control socket: listen: %w", err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// SpawnConfig says how to start one init.
type SpawnConfig struct {
	InitPath string
	Group    *cgroup.Group
	Listener *os.File // from Listen; the caller closes it after Spawn
	Stderr   *os.File // init's own log; nil for /dev/null
	// Netns, when set, is the network namespace init starts in (a
	// networked sandbox's, wired by netpolicy); nil: a fresh one with
	// only loopback.
	Netns *os.File
	// Dir is init's working directory at start, in its own mount
	// namespace: where it attaches the sandbox's root. (As root of its
	// user namespace, init could not walk the node's private run
	// directory to it.)
	Dir string
	// IDs is the host id range of the sandbox's user namespace: init
	// starts as its root (host IDs.Host), with every capability inside
	// the namespace and none outside it.
	IDs userns.Range
	// Spawner, when set, clones init (see Spawner); nil: the node does.
	Spawner *Spawner
}

// Spawn starts init in new namespaces inside Group, through sc.Spawner if
// set (directly if it has none running). The returned Setup must be
// completed with Process.Setup.
func Spawn(sc SpawnConfig) (*Process, *initproto.Conn, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("setup socket: %w", err)
	}
	child := os.NewFile(uintptr(pair[1]), "setup-child")
	defer child.Close()
	setup, err := initproto.NewConn(pair[0], "setup")
	if err != nil {
		return nil, nil, fmt.Errorf("setup socket: %w", err)
	}
	if sc.IDs.Size == 0 {
		setup.Close()
		return nil, nil, errors.New("start init: no id range for its user namespace")
	}
	var (
		pid, pidfd int
		viaSpawner bool
	)
	if sc.Spawner != nil {
		pid, pidfd, viaSpawner, err = sc.Spawner.spawn(sc, child)
	}
	if !viaSpawner {
		pid, pidfd, err = spawnDirect(sc, child)
	}
	if errors.Is(err, unix.EAGAIN) {
		// No PID to spare: the host's, or the sandboxes' parent cgroup's.
		setup.Close()
		return nil, nil, errdefs.ResourceExhausted("start %s: %v: no PID left for a new sandbox", sc.InitPath, err)
	}
	if err != nil {
		setup.Close()
		return nil, nil, fmt.Errorf("start %s: %w", sc.InitPath, err)
	}
	if viaSpawner {
		// The spawner, not the node, is init's parent and reaps it: a pid
		// may then be reused at once, so nothing here kills by pid.
		p, err := newProcess(pid, pidfd, false)
		if err == nil && !p.Alive() {
			// Exited already: the start time read may be another's.
			p.Release()
			err = fmt.Errorf("init %d exited at start", pid)
		}
		if err != nil {
			setup.Close()
			return nil, nil, err
		}
		return p, setup, nil
	}
	p, err := newProcess(pid, pidfd, true)
	if err != nil {
		unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, 0, nil)
		setup.Close()
		return nil, nil, err
	}
	return p, setup, nil
}

// spawnDirect clones init from the daemon, on a thread of its own that Go
// throws away afterwards (never the main thread, which Go keeps): it has
// been moved into the sandbox's cgroups, working directory and network
// namespace, which the clone inherits.
func spawnDirect(sc SpawnConfig, child *os.File) (pid, pidfd int, err error) {
	err = osthread.Run(func() (err error) {
		pid, pidfd, err = spawnOnThread(sc, child)
		return err
	})
	return pid, pidfd, err
}

func spawnOnThread(sc SpawnConfig, setupChild *os.File) (pid, pidfd int, err error) {
	if err := sc.Group.EnterThread(); err != nil {
		return 0, 0, err
	}
	// The child inherits this thread's working directory, copied into its
	// mount namespace. CLONE_FS unshared first, so that no other thread's
	// directory changes.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return 0, 0, fmt.Errorf("start init: unshare fs: %w", err)
	}
	if err := unix.Chdir(sc.Dir); err != nil {
		return 0, 0, fmt.Errorf("start init: chdir %s: %w", sc.Dir, err)
	}
	cgfd, err := sc.Group.OpenV2()
	if err != nil {
		return 0, 0, err
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return 0, 0, err
	}
	defer null.Close()
	stderr := null
	if sc.Stderr != nil {
		stderr = sc.Stderr
	}
	flags := uintptr(cloneFlags)
	if sc.Netns != nil {
		if err := unix.Setns(int(sc.Netns.Fd()), unix.CLONE_NEWNET); err != nil {
			return 0, 0, fmt.Errorf("start init: enter sandbox netns: %w", err)
		}
		flags &^= unix.CLONE_NEWNET
	}
	// A pooled network namespace joined above stays owned by the node's
	// user namespace: the sandbox cannot reconfigure it.
	c := spawner.Clone{Flags: flags, Host: sc.IDs.Host, Size: sc.IDs.Size, CgroupFD: -1,
		Stdin: int(null.Fd()), Stderr: int(stderr.Fd()), Listener: int(sc.Listener.Fd()), Setup: int(setupChild.Fd())}
	if cgfd != nil {
		defer cgfd.Close()
		c.CgroupFD = int(cgfd.Fd())
	}
	bin, err := os.Open(sc.InitPath)
	if err != nil {
		return 0, 0, fmt.Errorf("start init: %w", err)
	}
	defer bin.Close()
	c.Bin = int(bin.Fd())
	return spawner.Start(c)
}

// Setup sends init its config, with the mount fds it announces, and waits
// until it reports ready.
func (p *Process) Setup(ctx context.Context, setup *initproto.Conn, cfg initproto.Config, mounts ...int) error {
	defer setup.Close()
	cfg.Version, cfg.Op = initproto.Version, initproto.OpConfig
	stop := context.AfterFunc(ctx, func() { setup.SetDeadline(time.Now()) })
	defer stop()
	if err := setup.Send(cfg, mounts...); err != nil {
		return fmt.Errorf("send config: %w", p.ctxErr(ctx, err))
	}
	var r initproto.Reply
	if _, err := setup.Recv(&r); err != nil {
		return fmt.Errorf("wait ready: %w", p.ctxErr(ctx, err))
	}
	if r.Op != initproto.OpReady {
		return fmt.Errorf("init: %s", r.Error)
	}
	return nil
}

func (p *Process) ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	select {
	case <-p.done:
		return fmt.Errorf("init exited: %w", err)
	default:
		return err
	}
}

// StartTime reads the start time (clock ticks since boot) of pid.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, errdefs.NotFound("process %d is gone", pid)
		}
		return 0, err
	}
	return parseStartTime(string(b))
}

func parseStartTime(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 || i+2 > len(stat) {
		return 0, errors.New("malformed /proc/pid/stat")
	}
	// Fields after the comm start at "state" (field 3); starttime is 22.
	f := strings.Fields(stat[i+2:])
	if len(f) < 20 {
		return 0, errors.New("malformed /proc/pid/stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}
