// Package pidfd reads a process's pidfd: whether the process has exited.
// The daemon watches its inits and VMMs this way, and init its commands.
package pidfd

import "golang.org/x/sys/unix"

// Exited reports whether the process of pidfd fd has exited, asking the
// kernel now. A pidfd that cannot be polled counts as exited, so that no
// one waits on it forever.
func Exited(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(p, 0)
		if err != unix.EINTR {
			return err != nil || n > 0
		}
	}
}
