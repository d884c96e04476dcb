package container

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/launch"
	"github.com/corral-dev/corral/internal/runtime/userns"
	"golang.org/x/sys/unix"
)

var _ backend.Interactive = (*sandbox)(nil)

// Interactive implements backend.Interactive: Exec honours PTY and Started.
func (s *sandbox) Interactive() {}

// newPTYStdio opens a terminal on the sandbox's own devpts instance (so
// that tty(1) and ttyname work inside): the master stays with the node
// (output, input, resizes), the peer is the command's stdin, stdout and
// stderr. The peer comes from TIOCGPTPEER on the master, not from a path.
func (s *sandbox) newPTYStdio(size backend.TermSize) (*stdio, error) {
	mfd, err := s.openPTMX()
	if err != nil {
		return nil, err
	}
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(mfd)
		return nil, fmt.Errorf("unlock pty: %w", err)
	}
	if err := setSize(mfd, size); err != nil {
		unix.Close(mfd)
		return nil, err
	}
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		unix.Close(mfd)
		return nil, fmt.Errorf("open pty peer: %w", errno)
	}
	ptm := os.NewFile(uintptr(mfd), "ptmx")
	pts := os.NewFile(sfd, "pts")
	return &stdio{ptm: ptm, pts: pts, outR: ptm, inW: ptm, child: [3]int{int(sfd), int(sfd), int(sfd)}}, nil
}

// openPTMX opens /dev/pts/ptmx inside the sandbox's root (never through a
// symlink) and checks that it is a devpts multiplexer (char 5:2 on a
// devpts filesystem) before the node uses it.
func (s *sandbox) openPTMX() (int, error) {
	root, err := s.openRoot()
	if err != nil {
		return -1, fmt.Errorf("open sandbox root: %w", err)
	}
	defer root.Close()
	how := unix.OpenHow{
		Flags:   unix.O_RDWR | unix.O_NOCTTY | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_SYMLINKS,
	}
	fd, err := unix.Openat2(int(root.Fd()), "dev/pts/ptmx", &how)
	if err != nil {
		return -1, fmt.Errorf("open the sandbox's /dev/pts/ptmx: %w", err)
	}
	var fs unix.Statfs_t
	var st unix.Stat_t
	if unix.Fstatfs(fd, &fs) != nil || fs.Type != unix.DEVPTS_SUPER_MAGIC ||
		unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 5 || unix.Minor(st.Rdev) != 2 {
		unix.Close(fd)
		return -1, fmt.Errorf("the sandbox's /dev/pts/ptmx is not a devpts multiplexer")
	}
	return fd, nil
}

func setSize(fd int, size backend.TermSize) error {
	if size.Cols == 0 || size.Rows == 0 {
		return fmt.Errorf("pty size %dx%d: columns and rows must be positive", size.Cols, size.Rows)
	}
	if err := unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: size.Cols, Row: size.Rows}); err != nil {
		return fmt.Errorf("set pty size: %w", err)
	}
	return nil
}

// process implements backend.Process for a running exec.
type process struct {
	exec *launch.Exec
	pty  *os.File // nil unless a PTY exec
}

func (p *process) Pid() int { return p.exec.Pid }

func (p *process) Signal(sig int) error { return p.exec.Signal(sig) }

func (p *process) Resize(size backend.TermSize) error {
	if p.pty == nil {
		return fmt.Errorf("resize: the command has no terminal")
	}
	rc, err := p.pty.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = setSize(int(fd), size) }); err != nil {
		return err
	}
	return serr
}

// Rename implements backend.Renamer as the sandbox's root (see WriteFile).
func (s *sandbox) Rename(ctx context.Context, from, to string) error {
	return userns.AsRoot(s.ids, func() error { return s.FS.Rename(ctx, from, to) })
}

// WatchDir implements backend.Watcher; the watch also ends when the
// sandbox does.
func (s *sandbox) WatchDir(ctx context.Context, p string, recursive bool, ready func(), fn func(backend.WatchEvent)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.proc.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return s.FS.WatchDir(ctx, p, recursive, ready, fn)
}

// Usage implements backend.Usager: CPU and memory from the sandbox's
// cgroup, disk from the filesystem under its root (overlayfs reports its
// writable layer's).
func (s *sandbox) Usage(context.Context) (backend.Usage, error) {
	cg, err := s.group.Usage(true)
	if err != nil {
		return backend.Usage{}, err
	}
	u := backend.Usage{CPU: cg.CPU - s.since().cpu, MemoryBytes: cg.MemoryBytes, CacheBytes: cg.CacheBytes}
	root, err := s.openRoot()
	if err != nil {
		return backend.Usage{}, fmt.Errorf("sandbox %s: %w", s.id, err)
	}
	defer root.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(root.Fd()), &st); err != nil {
		return backend.Usage{}, fmt.Errorf("sandbox %s: statfs: %w", s.id, err)
	}
	u.DiskTotalBytes = int64(st.Blocks) * st.Bsize
	u.DiskUsedBytes = int64(st.Blocks-st.Bfree) * st.Bsize
	return u, nil
}

// Chown implements backend.Chowner: ids inside the sandbox are its host
// range's.
func (s *sandbox) Chown(ctx context.Context, p string, uid, gid uint32) error {
	if uid >= s.ids.Size || gid >= s.ids.Size {
		return errdefs.InvalidArgument("owner %d:%d: outside the sandbox's ids (0 to %d)", uid, gid, s.ids.Size-1)
	}
	return s.FS.Chown(ctx, p, s.ids.Host+uid, s.ids.Host+gid)
}

// DialPort implements backend.PortDialer: the socket is made on a thread
// inside the network namespace of the sandbox's commands, then used from
// anywhere.
func (s *sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port <= 0 || port > 65535 {
		return nil, errdefs.InvalidArgument("port: %d is not a TCP port", port)
	}
	ns, err := commandsNetns(s.proc.Pid)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: network namespace: %w", s.id, err)
	}
	defer ns.Close()
	if !s.proc.Alive() {
		return nil, errdefs.FailedPrecondition("sandbox %s is not running", s.id)
	}
	var conn net.Conn
	err = netpolicy.InNetns(ns, func() error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		conn = c
		return err
	})
	if err != nil {
		return nil, errdefs.Unavailable("sandbox %s: port %d: %v", s.id, port, err)
	}
	return conn, nil
}

// commandsNetns opens the network namespace the commands of the sandbox
// whose init is pid run in: init's own, or, after a recycle, the one its
// forking thread made for the tenant (the one thread of init elsewhere).
func commandsNetns(pid int) (*os.File, error) {
	dir := "/proc/" + strconv.Itoa(pid)
	own, err := os.Readlink(dir + "/ns/net")
	if err != nil {
		return nil, err
	}
	tasks, err := os.ReadDir(dir + "/task")
	if err != nil {
		return nil, err
	}
	for _, t := range tasks {
		p := dir + "/task/" + t.Name() + "/ns/net"
		if ns, err := os.Readlink(p); err == nil && ns != own {
			return os.Open(p)
		}
	}
	return os.Open(dir + "/ns/net")
}
