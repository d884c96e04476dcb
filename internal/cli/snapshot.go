package cli

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
)

func newSnapshotCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot SANDBOX",
		Short: "Save a microVM's memory, devices and disk while it keeps running; prints the snapshot id",
		Long: `Save a sandbox's whole state while it keeps running: its memory and device
state and a copy of its writable disk, in the node's data dir (durable across a
daemon restart). 'corral restore SNAP' makes new sandboxes from it. MicroVMs only:
containers are refused, naming why (live checkpoints of processes need CRIU).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (*client.Snapshot, error) {
				return c.Sandbox(args[0]).Snapshot(ctx)
			}, printLine(func(s *client.Snapshot) any { return s.ID }))
		},
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "rm SNAP...",
		Short: "Delete snapshots (sandboxes restored from them stay)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				for _, id := range args {
					if err := c.DeleteSnapshot(ctx, id); err != nil {
						return err
					}
				}
				return nil
			})
		},
	})
	return cmd
}

func newRestoreCmd(g *globals) *cobra.Command {
	var labels []string
	cmd := &cobra.Command{
		Use:   "restore SNAP",
		Short: "Make a new sandbox from a snapshot (processes continue; new id, agent secret and hostname); prints its id",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (*client.Info, error) {
				_, info, err := c.Restore(ctx, args[0], l)
				return info, err
			}, printLine(func(info *client.Info) any { return info.ID }))
		},
	}
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "label KEY=VALUE laid over the source's (repeatable)")
	return cmd
}

func newSnapshotsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "snapshots",
		Short: "List snapshots, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) ([]*client.Snapshot, error) {
				return c.ListSnapshots(ctx)
			}, func(all []*client.Snapshot) error {
				return printTable("ID\tSANDBOX\tBACKEND\tSIZE\tCREATED", "%s\t%s\t%s\t%s\t%s\n", all, func(s *client.Snapshot) []any {
					return []any{s.ID, s.SandboxID, s.Backend, formatBytes(s.Bytes), s.Created.Local().Format(time.DateTime)}
				})
			})
		},
	}
}

func newMigrateCmd(g *globals) *cobra.Command {
	var to string
	cmd := &cobra.Command{
		Use:   "migrate SANDBOX --to NODE",
		Short: "Move a microVM to another node of the cluster under the same id (processes and files go on)",
		Long: `Move a sandbox to another node: it is snapshotted on its node, the snapshot is
copied to NODE and restored there under the same id, calls with the id go to
the new node from then on, and the original is deleted. Through a control
instance, as the cluster's administrator. MicroVMs only: containers are
refused (live checkpoints of processes need CRIU).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if to == "" {
				return fmt.Errorf("--to: required (a node id, see 'corral nodes')")
			}
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (*client.Migration, error) {
				return c.Sandbox(args[0]).Migrate(ctx, to)
			}, func(m *client.Migration) error {
				fmt.Printf("%s: %s -> %s, %d MiB copied, snapshot %v, copy %v, restore %v, total %v\n", args[0], m.SourceNode, m.Sandbox.NodeID,
					m.BytesCopied>>20, m.SnapshotTime.Round(time.Millisecond), m.CopyTime.Round(time.Millisecond), m.RestoreTime.Round(time.Millisecond), m.Total.Round(time.Millisecond))
				if m.Warning != "" {
					fmt.Fprintln(os.Stderr, "corral: warning:", m.Warning)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "the node to move it to")
	return cmd
}
