package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/corral-dev/corral/client"
)

func newNodesCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "List a cluster's nodes: state, load, version, labels (ask a control instance)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) ([]client.Node, error) {
				return c.ClusterNodes(ctx)
			}, func(nodes []client.Node) error {
				return printTable("NODE\tSTATE\tADDRESS\tSANDBOXES\tMEMORY\tUTIL\tVERSION\tLABELS", "%s\t%s\t%s\t%d/%d\t%dMi/%dMi\t%.0f%%\t%s\t%s\n", nodes, func(n client.Node) []any {
					var labels []string
					for k, v := range n.Labels {
						labels = append(labels, k+"="+v)
					}
					sort.Strings(labels)
					state := n.State
					if n.Reason != "" {
						state += " (" + n.Reason + ")"
					}
					return []any{n.ID, state, n.Address,
						n.Sandboxes, n.CapacitySandboxes, n.MemoryBytes >> 20, n.CapacityMemoryBytes >> 20,
						100 * n.Utilisation, n.Version, strings.Join(labels, ",")}
				})
			})
		},
	}
}

func newNodeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Manage one node of a cluster"}
	var undrain bool
	drain := &cobra.Command{
		Use:   "drain NODE",
		Short: "Stop new placements on NODE (its sandboxes keep running); --undo resumes them",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (client.Node, error) {
				return c.DrainNode(ctx, args[0], undrain)
			}, func(n client.Node) error {
				_, err := fmt.Println(n.ID, n.State)
				return err
			})
		},
	}
	drain.Flags().BoolVar(&undrain, "undo", false, "resume placements on the node")
	cmd.AddCommand(drain)
	return cmd
}

// placementFlags are create's cluster placement flags.
type placementFlags struct {
	nodeLabels []string
	burstOK    bool
	requestID  string
	retry      bool
	spread     string
}

func (f *placementFlags) register(fl *pflag.FlagSet) {
	fl.StringArrayVar(&f.nodeLabels, "node-label", nil, "cluster: only a node with label KEY=VALUE (repeatable)")
	fl.BoolVar(&f.burstOK, "burst-ok", false, "cluster: may go to the burst pool (pool=burst nodes) while the primary pool is busy")
	fl.StringVar(&f.requestID, "request-id", "", "cluster: the create's id; with --retry a repeat returns the sandbox an earlier attempt made")
	fl.BoolVar(&f.retry, "retry", false, "cluster: this is a retry of --request-id")
	fl.StringVar(&f.spread, "spread-by", "", "cluster: a label KEY of this sandbox: prefer the node with the fewest sandboxes of the same KEY=VALUE")
}

func (f *placementFlags) options() (client.Placement, error) {
	labels, err := parseKV("node-label", f.nodeLabels)
	if err != nil {
		return client.Placement{}, err
	}
	if f.retry && f.requestID == "" {
		return client.Placement{}, fmt.Errorf("--retry: needs --request-id")
	}
	return client.Placement{NodeLabels: labels, BurstOK: f.burstOK, RequestID: f.requestID, Retry: f.retry, SpreadByLabel: f.spread}, nil
}
