package cgroup

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/mountinfo"
)

// FavorDynMods turns on the cgroup2 mount option favordynmods (Linux ≥ 6.0)
// if it is not on yet. Every sandbox's init is moved into its v1 cgroups
// (a v1 hierarchy cannot clone a process into a cgroup), and each move takes
// the kernel's global cgroup_threadgroup_rwsem for writing, which waits for
// an RCU grace period: 8–15 ms per create on this kind of host. With
// favordynmods the lock skips that wait, at a small cost to fork and exit.
// The lock is global, so the option on any cgroup2 mount covers the v1
// hierarchies too. It returns whether the option was changed; a host
// without a cgroup2 mount, or a kernel that refuses the option, is left as
// it is and reported as an error for the caller to log.
func FavorDynMods() (changed bool, err error) {
	m, err := cgroup2Mount()
	if err != nil || m == nil {
		return false, err
	}
	if m.HasSuperOption("favordynmods") {
		return false, nil
	}
	// Remount keeps the existing super options (nsdelegate,
	// memory_recursiveprot … on systemd hosts): cgroup2 resets what is not
	// named again.
	keep := slices.DeleteFunc(slices.Clone(m.SuperOptions), func(o string) bool { return o == "rw" || o == "ro" })
	data := strings.Join(append(keep, "favordynmods"), ",")
	if err := unix.Mount("none", m.MountPoint, "cgroup2", unix.MS_REMOUNT, data); err != nil {
		return false, fmt.Errorf("cgroup: remount %s with favordynmods: %w", m.MountPoint, err)
	}
	return true, nil
}

// cgroup2Mount returns the first cgroup2 mount, or nil.
func cgroup2Mount() (*mountinfo.Mount, error) {
	mounts, err := mountinfo.Read()
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			return &m, nil
		}
	}
	return nil, nil
}
