package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
)

// createFlags are the flags of create and run.
type createFlags struct {
	backend, image, cpu, memory, disk, workdir, user string
	pids                                             int64
	env, labels, allow                               []string
	net                                              string
	idleTimeout, maxLifetime                         time.Duration
	idleAction                                       string
	fresh                                            bool
	placement                                        placementFlags
	io                                               ioFlags
}

func (f *createFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.backend, "backend", "", "isolation backend: container (default) or microvm (own guest kernel; at least 128Mi memory)")
	fl.StringVar(&f.image, "image", "", "image name (default: the server's, busybox)")
	fl.StringVar(&f.cpu, "cpu", "", "CPU limit in cores or millicores (1, 0.5, 250m)")
	fl.StringVar(&f.memory, "memory", "", "memory limit (512Mi, 2Gi)")
	fl.StringVar(&f.disk, "disk", "", "writable layer size (1Gi)")
	fl.Int64Var(&f.pids, "pids", 0, "maximum number of processes")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "default working directory")
	fl.StringVarP(&f.user, "user", "u", "", "default user (name, uid or uid:gid)")
	fl.StringArrayVarP(&f.labels, "label", "l", nil, "label KEY=VALUE (repeatable)")
	fl.DurationVar(&f.idleTimeout, "idle-timeout", -1, "stop after no request for this long (0: never; default: server's)")
	fl.StringVar(&f.idleAction, "idle-action", "", "what --idle-timeout does: stop (default), pause or reclaim (pause and push memory to the node's swap)")
	fl.DurationVar(&f.maxLifetime, "max-lifetime", 0, "stop this long after creation (default: server's)")
	fl.StringVar(&f.net, "net", "", "network mode: none (loopback only, the default), allowlist (only --allow), open (all but the node, private and metadata ranges)")
	fl.StringArrayVar(&f.allow, "allow", nil, "allow a destination (repeatable; implies --net allowlist): a preset (pypi, npm, github, goproxy), a name (example.org:443, *.example.org), an address or prefix (203.0.113.0/24:80,443, [2001:db8::1]:53/udp)")
	fl.BoolVar(&f.fresh, "fresh", false, "a sandbox made from scratch and torn down by its delete: never one made ahead of demand or recycled from the project's deletes (serve --warm-pool, --recycle), and never recycled itself")
	f.placement.register(fl)
	f.io.register(fl)
}

func (f *createFlags) options() (client.CreateOptions, error) {
	o := client.CreateOptions{Backend: f.backend, Image: f.image, Workdir: f.workdir, User: f.user}
	var err error
	if o.Resources.CPUMillis, err = parseCPU(f.cpu); err != nil {
		return o, err
	}
	if o.Resources.MemoryBytes, err = parseBytes("memory", f.memory); err != nil {
		return o, err
	}
	if o.Resources.DiskBytes, err = parseBytes("disk", f.disk); err != nil {
		return o, err
	}
	o.Resources.Pids = f.pids
	if o.Resources.IO, err = f.io.limits(); err != nil {
		return o, err
	}
	o.Network = client.Network{Mode: client.NetworkMode(f.net), Allow: f.allow}
	if o.Placement, err = f.placement.options(); err != nil {
		return o, err
	}
	if o.Env, err = parseKV("env", f.env); err != nil {
		return o, err
	}
	if o.Labels, err = parseKV("label", f.labels); err != nil {
		return o, err
	}
	o.IdleAction = f.idleAction
	o.Fresh = f.fresh
	if f.idleTimeout >= 0 {
		o.IdleTimeout = &f.idleTimeout
	}
	if f.maxLifetime > 0 {
		o.MaxLifetime = &f.maxLifetime
	}
	return o, nil
}

func newCreateCmd(g *globals) *cobra.Command {
	f := &createFlags{}
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := f.options()
			if err != nil {
				return err
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				sb, err := c.Create(ctx, opts)
				if err != nil {
					return err
				}
				if g.json {
					info, err := sb.Info(ctx)
					if err != nil {
						return err
					}
					return printJSON(info)
				}
				fmt.Println(sb.ID())
				return nil
			})
		},
	}
	f.register(cmd)
	return cmd
}

// execFlags are the flags of exec and run.
type execFlags struct {
	shell, dir, user string
	env              []string
	timeout          time.Duration
	stdin            bool
	outputLimit      string
	key, step        string
}

func (f *execFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.shell, "sh", "", "run this script with sh -c instead of a command")
	fl.StringVar(&f.dir, "cwd", "", "working directory")
	fl.StringVar(&f.user, "as", "", "user to run as (name, uid or uid:gid)")
	fl.StringArrayVar(&f.env, "exec-env", nil, "extra environment KEY=VALUE for this command (repeatable)")
	fl.DurationVar(&f.timeout, "timeout", 0, "kill the command after this long (default: server's)")
	fl.BoolVarP(&f.stdin, "interactive", "i", false, "send this process's stdin to the command")
	fl.StringVar(&f.outputLimit, "output-limit", "", "stop reading output after this many bytes (default: server's)")
	fl.StringVar(&f.key, "key", "", "idempotency key: run the command once; a repeat of the key prints the recorded result")
	fl.StringVar(&f.step, "step", "", "idempotency key derived from the sandbox and this step name")
}

func (f *execFlags) command(args []string) (client.Command, error) {
	cmd := client.Command{Args: args, Shell: f.shell, Dir: f.dir, User: f.user, Timeout: f.timeout,
		Stdout: os.Stdout, Stderr: os.Stderr, IdempotencyKey: f.key, Step: f.step}
	if (f.shell == "") == (len(args) == 0) {
		return cmd, fmt.Errorf("give either a command after -- or --sh 'script', not both or neither")
	}
	var err error
	if cmd.Env, err = parseKV("exec-env", f.env); err != nil {
		return cmd, err
	}
	if cmd.OutputLimit, err = parseBytes("output-limit", f.outputLimit); err != nil {
		return cmd, err
	}
	if f.stdin {
		cmd.StdinReader = os.Stdin // streamed: no size cap
	}
	return cmd, nil
}

// runCommand executes cmd in sb and turns the result into the CLI's exit.
func runCommand(cmd *cobra.Command, g *globals, sb *client.Sandbox, c client.Command) error {
	if g.json {
		c.Stdout, c.Stderr = nil, nil
		res, err := sb.Run(cmd.Context(), c)
		if err != nil {
			return err
		}
		return printJSON(struct {
			*client.Result
			Stdout string
			Stderr string
		}{res, string(res.Stdout), string(res.Stderr)})
	}
	res, err := sb.Exec(cmd.Context(), c)
	if err != nil {
		return err
	}
	switch {
	case res.TimedOut:
		fmt.Fprintf(os.Stderr, "corral: command timed out after %s\n", res.Duration.Round(time.Millisecond))
	case res.OOMKilled:
		fmt.Fprintln(os.Stderr, "corral: command was killed: out of memory")
	case res.Truncated:
		fmt.Fprintln(os.Stderr, "corral: output was truncated at the output limit")
	}
	if res.ExitCode != 0 {
		code := res.ExitCode
		if res.Signal != 0 {
			code = 128 + res.Signal
		}
		return &ExitError{Code: code}
	}
	return nil
}

func newExecCmd(g *globals) *cobra.Command {
	f := &execFlags{}
	cmd := &cobra.Command{
		Use:   "exec SANDBOX [flags] -- COMMAND [ARG...]",
		Short: "Run a command in a sandbox, streaming its output; exits with its exit code",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.command(args[1:])
			if err != nil {
				return err
			}
			return g.withClient(cmd, func(_ context.Context, cl *client.Client) error {
				return runCommand(cmd, g, cl.Sandbox(args[0]), c)
			})
		},
	}
	f.register(cmd)
	return cmd
}

func newRunCmd(g *globals) *cobra.Command {
	cf, ef := &createFlags{}, &execFlags{}
	var keep bool
	cmd := &cobra.Command{
		Use:   "run [flags] -- COMMAND [ARG...]",
		Short: "Create a sandbox, run one command in it, and delete it",
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := cf.options()
			if err != nil {
				return err
			}
			c, err := ef.command(args)
			if err != nil {
				return err
			}
			return g.withClient(cmd, func(ctx context.Context, cl *client.Client) error {
				sb, err := cl.Create(ctx, opts)
				if err != nil {
					return err
				}
				if keep {
					fmt.Fprintln(os.Stderr, "sandbox:", sb.ID())
				} else {
					defer sb.Delete(ctx)
				}
				return runCommand(cmd, g, sb, c)
			})
		},
	}
	cf.register(cmd)
	ef.register(cmd)
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the sandbox afterwards (its id goes to stderr)")
	return cmd
}

func newLsCmd(g *globals) *cobra.Command {
	var labels []string
	var state string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List sandboxes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lbl, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) ([]*client.Info, error) {
				list, err := c.ListCluster(ctx, client.ListOptions{Labels: lbl, State: client.State(state)})
				if err != nil {
					return nil, err
				}
				for _, u := range list.UnavailableNodes {
					// A lost node's sandboxes are listed from its last summary.
					fmt.Fprintln(os.Stderr, "corral: could not ask:", u)
				}
				return list.Sandboxes, nil
			}, func(infos []*client.Info) error {
				return printTable("ID\tIMAGE\tSTATE\tCPU\tMEMORY\tAGE\tLABELS", "%s\t%s\t%s\t%dm\t%dMi\t%s\t%s\n", infos, func(i *client.Info) []any {
					return []any{i.ID, i.Image, i.State, i.Resources.CPUMillis,
						i.Resources.MemoryBytes >> 20, time.Since(i.CreatedAt).Round(time.Second), formatLabels(i.Labels)}
				})
			})
		},
	}
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "only sandboxes with label KEY=VALUE (repeatable)")
	cmd.Flags().StringVar(&state, "state", "", "only sandboxes in this state: running, paused, stopped (lost: a cluster's lost nodes' sandboxes)")
	return cmd
}

func formatLabels(l map[string]string) string {
	parts := make([]string, 0, len(l))
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

func newGetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get SANDBOX",
		Short: "Show one sandbox as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				info, err := c.Get(ctx, args[0])
				if err != nil {
					return err
				}
				return printJSON(info)
			})
		},
	}
}

// forEachID runs op on every id argument and reports all failures.
func forEachID(cmd *cobra.Command, g *globals, ids []string, op func(*client.Sandbox) error) error {
	return g.withClient(cmd, func(_ context.Context, c *client.Client) error {
		failed := 0
		for _, id := range ids {
			if err := op(c.Sandbox(id)); err != nil {
				fmt.Fprintf(os.Stderr, "corral: %s: %s\n", id, describe(err))
				failed++
			}
		}
		if failed > 0 {
			return &ExitError{Code: 1}
		}
		return nil
	})
}

func newRmCmd(g *globals) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "rm SANDBOX... | rm --all",
		Short: "Delete sandboxes (deleting one that is gone succeeds)",
		RunE: func(cmd *cobra.Command, ids []string) error {
			if all == (len(ids) > 0) {
				return fmt.Errorf("give sandbox ids or --all")
			}
			if all {
				c, err := g.client()
				if err != nil {
					return err
				}
				infos, err := c.List(cmd.Context(), client.ListOptions{})
				if err != nil {
					return err
				}
				for _, i := range infos {
					ids = append(ids, i.ID)
				}
			}
			return forEachID(cmd, g, ids, func(sb *client.Sandbox) error { return sb.Delete(cmd.Context()) })
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "delete every sandbox")
	return cmd
}
