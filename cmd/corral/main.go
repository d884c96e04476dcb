// Command corral is the one corral binary: the daemon (serve), the client
// commands (create, exec, run, ls, rm, cp, pause, resume), image building
// and benchmarks.
package main

import (
	"context"
	"os"

	"github.com/corral-dev/corral/internal/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:]))
}
