package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
)

func newNetCmd(g *globals) *cobra.Command {
	var allow, deny []string
	var mode string
	var replace bool
	cmd := &cobra.Command{
		Use:   "net SANDBOX [--allow RULE]... [--deny RULE]... [--mode MODE]",
		Short: "Show or change a sandbox's network policy and refused attempts",
		Long: `Show or change a running sandbox's network policy. The new rules are in
force when the command returns; connections the new rules refuse are cut.

Without flags it prints the policy and the refused attempts (connects, sends
and packets per destination, and names the DNS proxy refused).

Rules are TARGET[:PORTS][/PROTOCOLS]: a preset (pypi, npm, github, goproxy),
a name (example.org:443, *.example.org), an address or prefix
(203.0.113.0/24:80,443, [2001:db8::1]:53/udp). --deny removes a rule from
the allow list. A sandbox created with --net none has no interface: create
it with --net allowlist (no rules needed) to open it later.`,
		Example: `  corral net $id --allow pypi --allow example.org:443
  corral net $id --deny pypi
  corral net $id --mode none     # close everything (DNS included)
  corral net $id                 # policy and refused attempts`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				return showNetwork(ctx, g, c, args[0], client.NetworkUpdate{
					Mode: client.NetworkMode(mode), Allow: allow, Deny: deny, Replace: replace,
				})
			})
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&allow, "allow", nil, "add an allow rule (repeatable)")
	fl.StringArrayVar(&deny, "deny", nil, "remove an allow rule (repeatable)")
	fl.StringVar(&mode, "mode", "", "set the mode: none, allowlist or open")
	fl.BoolVar(&replace, "replace", false, "--allow rules replace the list instead of adding to it")
	return cmd
}

// showNetwork applies u to sandbox id's policy (when it changes anything),
// then prints the policy and the refused attempts.
func showNetwork(ctx context.Context, g *globals, c *client.Client, id string, u client.NetworkUpdate) error {
	sb := c.Sandbox(id)
	var policy client.Network
	var err error
	if len(u.Allow) > 0 || len(u.Deny) > 0 || u.Mode != "" || u.Replace {
		policy, err = sb.UpdateNetwork(ctx, u)
	} else {
		var info *client.Info
		if info, err = c.Get(ctx, id); err == nil {
			policy = info.Network
		}
	}
	if err != nil {
		return err
	}
	stats, err := sb.NetworkStats(ctx)
	if err != nil {
		return err
	}
	if g.json {
		return printJSON(struct {
			Network client.Network
			Stats   *client.NetworkStats
		}{policy, stats})
	}
	printNetwork(policy, stats)
	return nil
}

func printNetwork(n client.Network, st *client.NetworkStats) {
	fmt.Printf("mode: %s\n", n.Mode)
	if len(n.Allow) > 0 {
		fmt.Printf("allow: %s\n", strings.Join(n.Allow, " "))
	}
	fmt.Printf("refused: %d\n", st.RefusedTotal)
	if len(st.Refusals) == 0 {
		return
	}
	printTable("COUNT\tHOOK\tPROTO\tDESTINATION", "%d\t%s\t%s\t%s\n", st.Refusals, func(r client.NetworkRefusal) []any {
		dest := r.Name
		if r.Hook != "dns" {
			dest = r.Address
			if r.Port != 0 {
				dest = fmt.Sprintf("%s port %d", r.Address, r.Port)
			}
		}
		return []any{r.Count, r.Hook, r.Protocol, dest}
	})
}
