package cli

import (
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
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
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := c.Sandbox(args[0]).Snapshot(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(s)
			}
			fmt.Println(s.ID)
			return nil
		},
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "rm SNAP...",
		Short: "Delete snapshots (sandboxes restored from them stay)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.DeleteSnapshot(cmd.Context(), id); err != nil {
					return err
				}
			}
			return nil
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
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, info, err := c.Restore(cmd.Context(), args[0], l)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(info)
			}
			fmt.Println(sb.ID())
			return nil
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
			c, err := g.client()
			if err != nil {
				return err
			}
			all, err := c.ListSnapshots(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(all)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSANDBOX\tBACKEND\tSIZE\tCREATED")
			for _, s := range all {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.ID, s.SandboxID, s.Backend, formatBytes(s.Bytes), s.Created.Local().Format(time.DateTime))
			}
			return tw.Flush()
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
			c, err := g.client()
			if err != nil {
				return err
			}
			m, err := c.Sandbox(args[0]).Migrate(cmd.Context(), to)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(m)
			}
			fmt.Printf("%s: %s -> %s, %d MiB copied, snapshot %v, copy %v, restore %v, total %v\n", args[0], m.SourceNode, m.Sandbox.NodeID,
				m.BytesCopied>>20, m.SnapshotTime.Round(time.Millisecond), m.CopyTime.Round(time.Millisecond), m.RestoreTime.Round(time.Millisecond), m.Total.Round(time.Millisecond))
			if m.Warning != "" {
				fmt.Fprintln(os.Stderr, "corral: warning:", m.Warning)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "the node to move it to")
	return cmd
}
