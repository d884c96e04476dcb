// Command corral is the one corral binary: the daemon (serve), the client
// commands (create, exec, run, ls, rm, cp, pause, resume, call), image
// building and benchmarks.
package main

import (
	"context"
	"os"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/cli"
)

func main() {
	// Whatever fds the parent left open without close-on-exec must never
	// reach a child, least of all a sandbox's init.
	_ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	os.Exit(cli.Main(context.Background(), os.Args[1:]))
}
