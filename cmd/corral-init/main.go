// Command corral-init is PID 1 of a container sandbox. The node starts it
// with the control socket and a setup socket (see internal/guest/initproto);
// it is not meant to be run by hand. Build it static: CGO_ENABLED=0. Run
// with the single argument "spawner", it is instead the node's spawner of
// inits (internal/runtime/spawner), started by the node on the host.
package main

import (
	"github.com/corral-dev/corral/internal/guest/init"
	"github.com/corral-dev/corral/internal/runtime/spawner"
)

func main() {
	if spawner.Requested() {
		spawner.Main()
		return
	}
	initproc.Main()
}
