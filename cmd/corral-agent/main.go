// Command corral-agent is the init (PID 1) of a corral microVM guest, or,
// with --service, a system service of a full VM guest (vm backend images);
// see internal/guest/agent. The node puts it into the guest's initramfs as
// /init, or `corral vm-image build` into the image; it is built static
// (CGO_ENABLED=0) and is not meant to be run by hand.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/corral-dev/corral/internal/guest/agent"
)

func main() {
	if os.Getpid() == 1 {
		agent.Main() // a microVM's init; never returns
	}
	var cfg agent.ServiceConfig
	service := flag.Bool("service", false, "run as a system service of a full VM (not as PID 1)")
	flag.StringVar(&cfg.Port, "port", "", "virtio-serial port name of the node's channel")
	flag.StringVar(&cfg.SecretFile, "secret-file", "", "file holding the sandbox's secret (fw_cfg)")
	flag.Parse()
	if !*service {
		fmt.Fprintln(os.Stderr, "corral-agent: arguments are for --service mode only")
		os.Exit(2)
	}
	// Service returns only when it cannot serve; systemd restarts it.
	fmt.Fprintln(os.Stderr, "corral-agent:", agent.Service(cfg))
	os.Exit(1)
}
