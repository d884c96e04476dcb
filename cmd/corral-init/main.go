// Command corral-init is PID 1 of a container sandbox. The node starts it
// with the control socket and a setup socket (see internal/guest/initproto);
// it is not meant to be run by hand. Build it static: CGO_ENABLED=0.
package main

import "github.com/corral-dev/corral/internal/guest/init"

func main() { initproc.Main() }
