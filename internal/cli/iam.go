package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
)

// newClient connects to addr; $CORRAL_TOKEN is the bearer token (the SDK
// reads it) and $CORRAL_CA_CERT a PEM file trusted for https:// addresses.
func newClient(addr string) (*client.Client, error) {
	var opts []client.Option
	if ca := os.Getenv("CORRAL_CA_CERT"); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("CORRAL_CA_CERT: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CORRAL_CA_CERT: %s holds no PEM certificate", ca)
		}
		opts = append(opts, client.WithTLSConfig(&tls.Config{RootCAs: pool}))
	}
	return client.New(addr, opts...)
}

// quotaFlags are the quota flags of project create and project quota.
type quotaFlags struct {
	sandboxes      int64
	cpu, mem, disk string
	creates, calls float64
}

func (f *quotaFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.Int64Var(&f.sandboxes, "max-sandboxes", 0, "concurrent sandboxes (0: no limit of its own)")
	fl.StringVar(&f.cpu, "cpu", "", "total CPU of its sandboxes (cores, or 500m)")
	fl.StringVar(&f.mem, "memory", "", "total memory of its sandboxes (e.g. 64Gi)")
	fl.StringVar(&f.disk, "disk", "", "total disk of its sandboxes (e.g. 1Ti)")
	fl.Float64Var(&f.creates, "creates-per-sec", 0, "sandbox creates per second")
	fl.Float64Var(&f.calls, "calls-per-sec", 0, "fncall calls per second")
}

func (f *quotaFlags) quota() (client.Quota, error) {
	q := client.Quota{MaxSandboxes: f.sandboxes, CreatesPerSec: f.creates, CallsPerSec: f.calls}
	var err error
	if q.CPUMillis, err = parseCPU(f.cpu); err != nil {
		return q, err
	}
	if q.MemoryBytes, err = parseBytes("memory", f.mem); err != nil {
		return q, err
	}
	if q.DiskBytes, err = parseBytes("disk", f.disk); err != nil {
		return q, err
	}
	return q, nil
}

func newTokenCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Create, list and revoke API tokens"}
	var project, role, desc string
	var ttl time.Duration
	create := &cobra.Command{
		Use:   "create --project P [--role admin|member|viewer] [--ttl 24h]",
		Short: "Make a token; its secret is printed once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			type created struct {
				*client.Token
				Secret string
			}
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (created, error) {
				tok, secret, err := c.CreateToken(ctx, client.TokenOptions{Project: project, Role: role, TTL: ttl, Description: desc})
				return created{tok, secret}, err
			}, func(t created) error {
				fmt.Fprintf(os.Stderr, "token %s for project %s (%s); the secret is shown only now:\n", t.ID, t.Project, t.Role)
				fmt.Println(t.Secret)
				return nil
			})
		},
	}
	create.Flags().StringVar(&project, "project", "", "the token's project (required)")
	create.Flags().StringVar(&role, "role", "member", "admin, member or viewer")
	create.Flags().DurationVar(&ttl, "ttl", 0, "expire after this long (0: until revoked)")
	create.Flags().StringVar(&desc, "description", "", "what the token is for")
	var lsProject string
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the tokens you administer (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) ([]*client.Token, error) {
				return c.ListTokens(ctx, lsProject)
			}, func(toks []*client.Token) error {
				return printTable("ID\tPROJECT\tROLE\tEXPIRES\tDESCRIPTION", "%s\t%s\t%s\t%s\t%s\n", toks, func(t *client.Token) []any {
					exp := "never"
					if !t.ExpiresAt.IsZero() {
						exp = t.ExpiresAt.Format(time.RFC3339)
					}
					return []any{t.ID, t.Project, t.Role, exp, t.Description}
				})
			})
		},
	}
	ls.Flags().StringVar(&lsProject, "project", "", "only this project and beneath")
	revoke := &cobra.Command{
		Use:   "revoke ID...",
		Short: "Revoke tokens: they fail from the next call on",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				for _, id := range args {
					if err := c.RevokeToken(ctx, id); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	cmd.AddCommand(create, ls, revoke)
	return cmd
}

func newProjectCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "project", Short: "Manage projects (nested, with delegated quotas)"}
	var qf quotaFlags
	create := &cobra.Command{
		Use:   "create PATH [quota flags]",
		Short: "Make a project; a subproject's quota comes out of what its parent has left",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			q, err := qf.quota()
			if err != nil {
				return err
			}
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) ([]*client.Project, error) {
				p, err := c.CreateProject(ctx, args[0], q)
				return []*client.Project{p}, err
			}, printProjects)
		},
	}
	qf.register(create)
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the projects you see, with quota and usage",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) ([]*client.Project, error) {
				return c.ListProjects(ctx)
			}, printProjects)
		},
	}
	var keep bool
	rm := &cobra.Command{
		Use:   "rm PATH",
		Short: "Delete a project with its subprojects, tokens, sandboxes and images",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				return c.DeleteProject(ctx, args[0], keep)
			})
		},
	}
	rm.Flags().BoolVar(&keep, "keep", false, "refuse if the project holds anything, instead of deleting it")
	var sq quotaFlags
	quota := &cobra.Command{
		Use:   "quota PATH [quota flags]",
		Short: "Show a project's quota and usage, or replace its quota when flags are given",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) ([]*client.Project, error) {
				var p *client.Project
				var err error
				if cmd.Flags().NFlag() == 0 || (cmd.Flags().NFlag() == 1 && cmd.Flags().Changed("json")) {
					p, err = c.GetProject(ctx, args[0])
				} else {
					var q client.Quota
					if q, err = sq.quota(); err != nil {
						return nil, err
					}
					p, err = c.SetQuota(ctx, args[0], q)
				}
				return []*client.Project{p}, err
			}, printProjects)
		},
	}
	sq.register(quota)
	var unshare bool
	share := &cobra.Command{
		Use:   "share PATH IMAGE",
		Short: "Let project PATH (and its subprojects) use an image name of yours, every version",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				if unshare {
					return c.UnshareImage(ctx, args[1], args[0])
				}
				return c.ShareImage(ctx, args[1], args[0])
			})
		},
	}
	share.Flags().BoolVar(&unshare, "unshare", false, "take a share back")
	cmd.AddCommand(create, ls, rm, quota, share)
	return cmd
}

// limit formats "used/limit" (limit "-" for none).
func limit(used, lim int64, format func(int64) string) string {
	l := "-"
	if lim > 0 {
		l = format(lim)
	}
	return format(used) + "/" + l
}

// printProjects is the text of the project commands.
func printProjects(ps []*client.Project) error {
	num := func(v int64) string { return strconv.FormatInt(v, 10) }
	cpu := func(v int64) string { return fmt.Sprintf("%dm", v) }
	rate := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return printTable("PROJECT\tSANDBOXES\tCPU\tMEMORY\tDISK\tCREATES/S\tCALLS/S\tDELEGATED SANDBOXES", "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", ps, func(p *client.Project) []any {
		return []any{p.Path,
			limit(p.Usage.Sandboxes, p.Quota.MaxSandboxes, num), limit(p.Usage.CPUMillis, p.Quota.CPUMillis, cpu),
			limit(p.Usage.MemoryBytes, p.Quota.MemoryBytes, formatBytes), limit(p.Usage.DiskBytes, p.Quota.DiskBytes, formatBytes),
			rate(p.Quota.CreatesPerSec), rate(p.Quota.CallsPerSec), p.Delegated.MaxSandboxes}
	})
}

func newWhoAmICmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show who the server takes you for (node administrator, or a token's project and role)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (*client.Identity, error) {
				return c.WhoAmI(ctx)
			}, func(id *client.Identity) error {
				if id.NodeAdmin {
					fmt.Println("node administrator (the node's unix socket)")
					return nil
				}
				fmt.Printf("token %s: project %s, role %s", id.Token.ID, id.Project, id.Role)
				if !id.Token.ExpiresAt.IsZero() {
					fmt.Printf(", expires %s", id.Token.ExpiresAt.Format(time.RFC3339))
				}
				fmt.Println()
				return nil
			})
		},
	}
}

func newAuditCmd(g *globals) *cobra.Command {
	var f client.AuditFilter
	var follow bool
	cmd := &cobra.Command{
		Use:   "audit [--follow] [--project P]",
		Short: "Show the audit log of management requests",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				return audit(ctx, g, c, f, follow)
			})
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new entries")
	cmd.Flags().StringVar(&f.Project, "project", "", "only this project and beneath")
	cmd.Flags().IntVar(&f.Limit, "limit", 0, "only the last N entries (0: all)")
	return cmd
}

// audit prints the audit entries f selects, or follows new ones.
func audit(ctx context.Context, g *globals, c *client.Client, f client.AuditFilter, follow bool) error {
	show := func(e client.AuditEntry) error {
		if g.json {
			return printJSON(e)
		}
		who := "node-admin"
		if !e.NodeAdmin {
			who = "token:" + e.TokenID + " project:" + e.Project
		}
		_, err := fmt.Printf("%s  %s  %s  %s  %s\n", e.Time.Format(time.RFC3339Nano), who, e.Procedure, e.Summary, e.Result)
		return err
	}
	if follow {
		return c.FollowAudit(ctx, f, show)
	}
	es, err := c.Audit(ctx, f)
	if err != nil {
		return err
	}
	for _, e := range es {
		if err := show(e); err != nil {
			return err
		}
	}
	return nil
}
