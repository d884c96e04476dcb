package agent

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/guest/exec"
)

// dropBounding removes every capability but guestexec.Caps from the bounding set of
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
	for _, c := range guestexec.Caps {
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
