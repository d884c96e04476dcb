package agent

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// commandCaps are the capabilities a command in the guest can hold: the
// container backend's set (initproc.DefaultCaps; a test keeps them equal).
// Guest root keeps what an ordinary container root has, and loses what
// would reach the agent or the guest kernel itself: SYS_PTRACE (the
// agent's memory and fds, hence its secret and channel), SYS_ADMIN (mounts,
// including the read-only shell), SYS_MODULE, SYS_RAWIO (/proc/kcore,
// /dev/mem), SYS_BOOT (kexec), MKNOD, NET_RAW, SYSLOG, BPF, PERFMON …
var commandCaps = []uintptr{
	unix.CAP_CHOWN,
	unix.CAP_DAC_OVERRIDE,
	unix.CAP_FOWNER,
	unix.CAP_FSETID,
	unix.CAP_KILL,
	unix.CAP_SETGID,
	unix.CAP_SETUID,
	unix.CAP_SETFCAP,
	unix.CAP_NET_BIND_SERVICE,
}

// dropBounding removes every other capability from the bounding set of
// all the agent's threads, so that no command it starts (root, setuid
// binaries and file capabilities included) can hold one. The agent keeps
// its own permitted set for its file operations.
func dropBounding() error {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return fmt.Errorf("cap_last_cap: %w", err)
	}
	last, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("cap_last_cap: %w", err)
	}
	keep := map[uintptr]bool{}
	for _, c := range commandCaps {
		keep[c] = true
	}
	for c := uintptr(0); c <= uintptr(last); c++ {
		if keep[c] {
			continue
		}
		if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0); e != 0 {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, e)
		}
	}
	return nil
}
