package cli

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
)

// newVMImageCmd is `corral vm-image`: the disk images of backend vm.
func newVMImageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "vm-image",
		Short: "Manage the disk images that sandboxes of backend vm boot",
		Example: `  corral vm-image build debian            # Debian 12 with qemu-guest-agent, as debian@12
  corral vm-image import win.qcow2 --name windows@11 --firmware uefi
  corral create --backend vm --image debian@12 --memory 1G --disk 4G`,
	}
	var node string
	// VM images are each node's own: in a cluster, say which.
	cmd.PersistentFlags().StringVar(&node, "node", "", "in a cluster, the node (default: every node for ls, else the only one running the vm backend)")
	cmd.AddCommand(newVMImageBuildCmd(g, &node), newVMImageImportCmd(g, &node), newVMImageLsCmd(g, &node), newVMImageRmCmd(g, &node))
	return cmd
}

func newVMImageBuildCmd(g *globals, node *string) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "build RECIPE",
		Short: "Build a bootable image on the node (recipe: debian)",
		Long: `Builds a VM image on the node. Recipe debian runs mmdebstrap from the node's
own apt sources: Debian 12 with its kernel, systemd, qemu-guest-agent and
python3, root logged in on the VGA console (tty1), booted directly from the
kernel kept beside the disk. Needs root on the node (the unix socket).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			start := time.Now()
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (client.VMImage, error) {
				return c.VMImagesOn(*node).Build(ctx, args[0], name, func(line string) {
					fmt.Fprintln(os.Stderr, line)
				})
			}, func(im client.VMImage) error {
				fmt.Printf("%s\t%s\t%s\tbuilt in %v\n", im.Ref, formatBytes(im.FileSize), im.Firmware, time.Since(start).Round(time.Second))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "NAME@VERSION to record (default debian@12)")
	return cmd
}

func newVMImageImportCmd(g *globals, node *string) *cobra.Command {
	var name, firmware string
	cmd := &cobra.Command{
		Use:   "import FILE",
		Short: "Import a qcow2 or raw disk (streamed from this machine)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" {
				return fmt.Errorf("--name NAME@VERSION is required")
			}
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (client.VMImage, error) {
				return c.VMImagesOn(*node).Import(ctx, f, name, firmware)
			}, func(im client.VMImage) error {
				fmt.Printf("%s\t%s\t%s virtual\t%s\n", im.Ref, im.Format, formatBytes(im.VirtualSize), im.Firmware)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "NAME@VERSION (required)")
	cmd.Flags().StringVar(&firmware, "firmware", "bios", "bios or uefi")
	return cmd
}

func newVMImageLsCmd(g *globals, node *string) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List VM images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) ([]client.VMImage, error) {
				return c.VMImagesOn(*node).List(ctx)
			}, func(ims []client.VMImage) error {
				return printTable("REF\tFORMAT\tFIRMWARE\tVIRTUAL\tON DISK\tNODE\tSOURCE", "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ims, func(im client.VMImage) []any {
					return []any{im.Ref, im.Format, im.Firmware, formatBytes(im.VirtualSize), formatBytes(im.FileSize), im.Node, im.Source}
				})
			})
		},
	}
}

func newVMImageRmCmd(g *globals, node *string) *cobra.Command {
	return &cobra.Command{
		Use:   "rm REF",
		Short: "Remove a VM image no sandbox uses",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				return c.VMImagesOn(*node).Remove(ctx, args[0])
			})
		},
	}
}

// newScreenshotCmd is `corral screenshot ID -o x.png`.
func newScreenshotCmd(g *globals) *cobra.Command {
	var out string
	var scale float64
	cmd := &cobra.Command{
		Use:   "screenshot ID",
		Short: "Save a vm sandbox's screen as PNG",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				shot, err := c.Screenshot(ctx, args[0], scale)
				if err != nil {
					return err
				}
				if out == "-" {
					_, err = os.Stdout.Write(shot.PNG)
					return err
				}
				if err := os.WriteFile(out, shot.PNG, 0o644); err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "%s: %dx%d\n", out, shot.Width, shot.Height)
				return nil
			})
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "screen.png", "file to write (- for stdout)")
	cmd.Flags().Float64Var(&scale, "scale", 0, "shrink by this factor, in (0, 1]")
	return cmd
}

// newInputCmd is `corral input ID --type 'hello' --key ctrl-alt-t
// --click 100,200`: the events run in the order of the flags.
func newInputCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "input ID [--type TEXT] [--key COMBO] [--move X,Y] [--click X,Y] [--right-click X,Y] [--scroll X,Y,DELTA]...",
		Short: "Type, press keys and drive the mouse of a vm sandbox",
		Example: `  corral input $id --type 'echo corral' --key enter
  corral input $id --key ctrl-alt-t --click 100,200 --scroll 100,200,3`,
		Args:               cobra.MinimumNArgs(1),
		DisableFlagParsing: true, // flags may repeat, in order
		RunE: func(cmd *cobra.Command, args []string) error {
			// Flag parsing is off for this command: the global flags
			// arrive here too, wherever they were given.
			var rest []string
			for i := 0; i < len(args); i++ {
				switch a := args[i]; {
				case a == "-h" || a == "--help":
					return cmd.Help()
				case a == "--json":
					g.json = true
				case a == "--addr" && i+1 < len(args):
					g.addr = args[i+1]
					i++
				case strings.HasPrefix(a, "--addr="):
					g.addr = strings.TrimPrefix(a, "--addr=")
				default:
					rest = append(rest, a)
				}
			}
			if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
				return fmt.Errorf("input: the sandbox ID comes first")
			}
			args = rest
			events, err := parseInputArgs(args[1:])
			if err != nil {
				return err
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				return c.SendInput(ctx, args[0], events...)
			})
		},
	}
	return cmd
}

// parseInputArgs reads --type/--key/--move/--click/--right-click/--scroll
// pairs in order (also --flag=value).
func parseInputArgs(args []string) ([]client.InputEvent, error) {
	var events []client.InputEvent
	for i := 0; i < len(args); i++ {
		flag, val, ok := strings.Cut(args[i], "=")
		if !ok {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("%s: needs a value", args[i])
			}
			i++
			val = args[i]
		}
		point := func(n int) ([]int, error) {
			parts := strings.Split(val, ",")
			if len(parts) != n {
				return nil, fmt.Errorf("%s %q: want %d comma-separated numbers", flag, val, n)
			}
			out := make([]int, n)
			for j, p := range parts {
				v, err := strconv.Atoi(strings.TrimSpace(p))
				if err != nil {
					return nil, fmt.Errorf("%s %q: %v", flag, val, err)
				}
				out[j] = v
			}
			return out, nil
		}
		switch flag {
		case "--type":
			events = append(events, client.InputEvent{Text: val})
		case "--key":
			events = append(events, client.InputEvent{Keys: val})
		case "--move", "--click", "--right-click":
			p, err := point(2)
			if err != nil {
				return nil, err
			}
			ev := client.InputEvent{Move: flag == "--move", Click: flag != "--move", X: p[0], Y: p[1]}
			if flag == "--right-click" {
				ev.Button = "right"
			}
			events = append(events, ev)
		case "--scroll":
			p, err := point(3)
			if err != nil {
				return nil, err
			}
			events = append(events, client.InputEvent{Scroll: true, X: p[0], Y: p[1], ScrollDelta: p[2]})
		default:
			return nil, fmt.Errorf("%s: unknown (use --type, --key, --move, --click, --right-click, --scroll)", flag)
		}
	}
	if len(events) == 0 {
		return nil, fmt.Errorf("no events: give --type, --key, --move, --click or --scroll")
	}
	return events, nil
}
