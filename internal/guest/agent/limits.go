package agent

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// commandsGroup is the guest cgroup "commands" the agent starts every
// command in: from boot as a microVM's PID 1 (ensure), else once the node
// sent limits (OpLimits). Its cgroup2 hierarchy is mounted detached
// (fsmount, attached to no path): no command sees it, so none, guest root
// included, can raise the limits or leave the group.
type commandsGroup struct {
	mu  sync.Mutex
	dir *os.File // the group's directory; nil until made
}

// ensure makes the group if it is not made yet.
func (g *commandsGroup) ensure() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ensureLocked()
}

func (g *commandsGroup) ensureLocked() error {
	if g.dir != nil {
		return nil
	}
	dir, err := makeCommandsGroup()
	if err != nil {
		return err
	}
	g.dir = dir
	return nil
}

// set creates the group on first use and writes lim into it.
func (g *commandsGroup) set(lim *agentproto.Limits) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.ensureLocked(); err != nil {
		return fmt.Errorf("agent: limits: %w", err)
	}
	pids := "max"
	if lim.Pids > 0 {
		pids = strconv.FormatInt(lim.Pids, 10)
	}
	if err := writeAt(int(g.dir.Fd()), "pids.max", pids); err != nil {
		return fmt.Errorf("agent: limits: %w", err)
	}
	return nil
}

// join has attr's command start in the group (CLONE_INTO_CGROUP), when
// there is one: it is never closed once made.
func (g *commandsGroup) join(sys *syscall.SysProcAttr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dir != nil {
		sys.UseCgroupFD, sys.CgroupFD = true, int(g.dir.Fd())
	}
}

// makeCommandsGroup mounts a cgroup2 hierarchy detached, enables the pids
// and memory controllers below its root (where the agent stays) and opens
// the commands group, made if missing (a restored guest has it already),
// with memory.max below the guest's RAM (commandsMemoryMax).
func makeCommandsGroup() (*os.File, error) {
	fsfd, err := unix.Fsopen("cgroup2", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fsopen cgroup2: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, fmt.Errorf("create cgroup2: %w", err)
	}
	mnt, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fsmount cgroup2: %w", err)
	}
	// The open group keeps the detached mount alive.
	defer unix.Close(mnt)
	if err := writeAt(mnt, "cgroup.subtree_control", "+pids"); err != nil {
		return nil, errdefs.NotSupported("guest kernel without the pids cgroup controller: %v", err)
	}
	memory := writeAt(mnt, "cgroup.subtree_control", "+memory") == nil
	if err := unix.Mkdirat(mnt, "commands", 0o755); err != nil && err != unix.EEXIST {
		return nil, fmt.Errorf("mkdir commands cgroup: %w", err)
	}
	fd, err := unix.Openat(mnt, "commands", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open commands cgroup: %w", err)
	}
	if limit, err := commandsMemoryMax(); memory && err == nil {
		if err := writeAt(fd, "memory.max", strconv.FormatInt(limit, 10)); err != nil {
			logf("commands cgroup: %v", err)
		}
	}
	return os.NewFile(uintptr(fd), "commands"), nil
}

// commandsMemoryMax keeps a quarter of the guest's RAM, at least 64 MiB,
// out of the commands' reach: the kernel's, the agent's (the files its
// file operations wrote to a tmpfs are charged to it) and the page cache
// of the programs that run. Without it a memory bomb fills the RAM
// and the guest kernel, before its OOM killer fires, reclaims and reads
// back the file pages every process runs from (under TCG, for minutes);
// in the group the bomb is OOM-killed once the group's own reclaim fails,
// and the agent goes on answering.
func commandsMemoryMax() (int64, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, err
	}
	total := int64(si.Totalram) * int64(si.Unit)
	return total - max(64<<20, total/4), nil
}

// writeAt writes val to the cgroup file name in directory dirfd.
func writeAt(dirfd int, name, val string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(val)); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}
