package cli

import (
	"context"
	"os"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/bench"
)

func newBenchVMCmd(g *globals) *cobra.Command {
	o := bench.VMOptions{Log: os.Stderr}
	cmd := serverBenchCmd(g, "vm", "Full-VM boot→ready, exec via corral-agent and via qemu-ga, screenshot latency and host memory per idle VM, beside microvm and container",
		`Measures the vm backend beside microvm and container sandboxes of the same run:
create→first exec, exec of true through corral-agent (the API's path when the image
carries it) and through qemu-ga on the same VM (its socket, from this host), QMP
screendump to PNG, the host memory of an idle VM (QEMU RSS plus its run dir's files),
and snapshot of the running VM → restore into a new sandbox beside the same for the
microvm. Needs a VM image
(corral vm-image build debian). Run it on the server's machine: QEMU processes are
read from /proc.`,
		func(ctx context.Context, c *client.Client) (tabler, error) {
			return bench.VM(ctx, c, o)
		})
	fl := cmd.Flags()
	fl.IntVar(&o.Boots, "boots", 1, "create→first exec samples of vm (TCG boots take minutes)")
	fl.IntVar(&o.PeerBoots, "peer-boots", 3, "create→first exec samples of microvm and container")
	fl.IntVar(&o.Execs, "execs", 20, "exec samples per backend")
	fl.IntVar(&o.Shots, "shots", 10, "screenshots")
	fl.IntVar(&o.Snapshots, "snapshots", 2, "snapshot→restore samples of the vm and of the microvm (negative: none)")
	fl.StringVar(&o.Image, "image", "debian@12", "VM image")
	fl.StringVar(&o.PeerImage, "peer-image", "busybox", "image of the microvm and container peers")
	sizeVar(cmd, &o.MemoryBytes, "memory", "512Mi", "guest RAM of the VM (and memory limit of the container)")
	return cmd
}
