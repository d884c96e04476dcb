package spawner

import (
	"fmt"
	"syscall"

	"github.com/corral-dev/corral/internal/guest/initproto"
)

// BinFd is where init finds its own binary at exec: init execs as root of
// its user namespace, a host uid that may not traverse the directories on
// the binary's path, so it runs the file the node opened (and closes this
// fd first thing).
const BinFd = initproto.SetupFd + 1

// Clone is what one init's clone needs beyond the calling thread's own
// state: the child inherits the thread's cgroups (v1), working directory
// and network namespace, which the caller has set.
type Clone struct {
	// Flags are the namespaces to create, without CLONE_NEWUSER (always
	// added, first, so that the others belong to the new user namespace).
	Flags uintptr
	// Host and Size are the host id range mapped to 0… in the new user
	// namespace; init starts as its root.
	Host, Size uint32
	// CgroupFD is the v2 cgroup directory for CLONE_INTO_CGROUP; -1: none.
	CgroupFD int
	// The child's fds 0, 2 (and 1), ListenFd, SetupFd and BinFd.
	Stdin, Stderr, Listener, Setup, Bin int
}

// Start clones and execs init on the calling, locked thread. The thread's
// effective uid is the sandbox's own while it clones (becomeOwner) and is
// restored after.
func Start(c Clone) (pid, pidfd int, err error) {
	if c.Size == 0 {
		return 0, 0, fmt.Errorf("start init: no id range for its user namespace")
	}
	// Go writes the maps from the parent before init runs; setgroups stays
	// allowed for execs' groups.
	idmap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(c.Host), Size: int(c.Size)}}
	pidfd = -1
	attr := &syscall.SysProcAttr{
		Cloneflags: c.Flags | syscall.CLONE_NEWUSER, PidFD: &pidfd,
		UidMappings: idmap, GidMappings: idmap, GidMappingsEnableSetgroups: true,
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
	}
	if c.CgroupFD >= 0 {
		attr.UseCgroupFD, attr.CgroupFD = true, c.CgroupFD
	}
	files := []uintptr{uintptr(c.Stdin), uintptr(c.Stderr), uintptr(c.Stderr),
		uintptr(c.Listener), uintptr(c.Setup), uintptr(c.Bin)}
	restoreOwner, err := becomeOwner(c.Host)
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		if rerr := restoreOwner(); rerr != nil && err == nil {
			err = rerr
		}
	}()
	pid, err = syscall.ForkExec(fmt.Sprintf("/proc/self/fd/%d", BinFd), []string{"corral-init"}, &syscall.ProcAttr{
		// One P from the start (init's own setting comes after the
		// runtime has started threads for every CPU).
		Env: []string{"GOMAXPROCS=1"}, Files: files, Sys: attr,
	})
	if err != nil {
		return 0, 0, fmt.Errorf("start init: %w", err)
	}
	return pid, pidfd, nil
}
