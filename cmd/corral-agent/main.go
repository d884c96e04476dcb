// Command corral-agent is the init (PID 1) of a corral microVM guest; see
// internal/guest/agent. The node puts it into the guest's initramfs as /init; it
// is built static (CGO_ENABLED=0) and is not meant to be run by hand.
package main

import "github.com/corral-dev/corral/internal/guest/agent"

func main() { agent.Main() }
