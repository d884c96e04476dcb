package cli

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/bench"
)

func newPauseCmd(g *globals) *cobra.Command {
	var reclaim bool
	var labels []string
	cmd := &cobra.Command{
		Use:   "pause SANDBOX... | pause -l KEY=VALUE...",
		Short: "Freeze sandboxes, by id or by label (any later request resumes them)",
		Long: `Freeze sandboxes, by id or every running one carrying all of the -l labels.

--reclaim also pushes the frozen memory out of RAM: a container's to the node's
swap area (corral serve --swap SIZE), a microVM's to a snapshot on disk. Resume
is unchanged; pages come back as the processes touch them.`,
		RunE: func(cmd *cobra.Command, ids []string) error {
			if len(labels) > 0 {
				return bulk(cmd, g, labels, ids, func(ctx context.Context, c *client.Client, l map[string]string) (*client.BulkResult, error) {
					return c.PauseMany(ctx, l, reclaim)
				})
			}
			if len(ids) == 0 {
				return fmt.Errorf("give sandbox ids or -l KEY=VALUE")
			}
			return forEachID(cmd, g, ids, func(sb *client.Sandbox) error {
				if !reclaim {
					return sb.Pause(cmd.Context())
				}
				r, err := sb.Reclaim(cmd.Context())
				if err == nil && !g.json {
					fmt.Printf("%s: resident %s -> %s, swapped %s\n", sb.ID(), formatBytes(r.ResidentBeforeBytes), formatBytes(r.ResidentAfterBytes), formatBytes(r.SwappedBytes))
				}
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&reclaim, "reclaim", false, "also push the paused memory out of RAM")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "pause every sandbox with this label KEY=VALUE (repeatable: all must match)")
	return cmd
}

func newResumeCmd(g *globals) *cobra.Command {
	var labels []string
	cmd := &cobra.Command{
		Use:   "resume SANDBOX... | resume -l KEY=VALUE...",
		Short: "Thaw paused sandboxes, by id or by label",
		RunE: func(cmd *cobra.Command, ids []string) error {
			if len(labels) > 0 {
				return bulk(cmd, g, labels, ids, func(ctx context.Context, c *client.Client, l map[string]string) (*client.BulkResult, error) {
					return c.ResumeMany(ctx, l)
				})
			}
			if len(ids) == 0 {
				return fmt.Errorf("give sandbox ids or -l KEY=VALUE")
			}
			return forEachID(cmd, g, ids, func(sb *client.Sandbox) error { return sb.Resume(cmd.Context()) })
		},
	}
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "resume every sandbox with this label KEY=VALUE (repeatable: all must match)")
	return cmd
}

func bulk(cmd *cobra.Command, g *globals, labels, ids []string, op func(context.Context, *client.Client, map[string]string) (*client.BulkResult, error)) error {
	if len(ids) > 0 {
		return fmt.Errorf("give sandbox ids or -l, not both")
	}
	l, err := parseKV("label", labels)
	if err != nil {
		return err
	}
	return fetch(cmd, g, func(ctx context.Context, c *client.Client) (*client.BulkResult, error) {
		return op(ctx, c, l)
	}, func(r *client.BulkResult) error { return printBulk(cmd, r) })
}

// printBulk prints how many sandboxes a bulk operation did, and what failed to stderr.
func printBulk(cmd *cobra.Command, r *client.BulkResult) error {
	fmt.Printf("%s: %d sandboxes", cmd.Name(), r.Done)
	if r.ResidentBeforeBytes > 0 {
		fmt.Printf(", resident %s -> %s", formatBytes(r.ResidentBeforeBytes), formatBytes(r.ResidentAfterBytes))
	}
	fmt.Println()
	failed := slices.Sorted(maps.Keys(r.Failures))
	for _, id := range failed {
		fmt.Fprintf(os.Stderr, "corral: %s: %s\n", id, r.Failures[id])
	}
	nodes := slices.Sorted(maps.Keys(r.NodeFailures))
	for _, id := range nodes {
		fmt.Fprintf(os.Stderr, "corral: node %s: %s\n", id, r.NodeFailures[id])
	}
	if len(failed)+len(nodes) > 0 {
		return &ExitError{Code: 1}
	}
	return nil
}

func newExecsCmd(g *globals) *cobra.Command {
	var since uint64
	cmd := &cobra.Command{
		Use:   "execs SANDBOX",
		Short: "List a sandbox's exec log: the commands run with an idempotency key (exec --key/--step)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) ([]client.ExecLogEntry, error) {
				return c.Sandbox(args[0]).ListExecs(ctx, since)
			}, func(log []client.ExecLogEntry) error {
				return printTable("SEQ\tSTATE\tEXIT\tDURATION\tOUTPUT\tKEY\tCOMMAND", "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", log, func(e client.ExecLogEntry) []any {
					exit, dur := "-", "-"
					if e.Result != nil {
						exit, dur = fmt.Sprint(e.Result.ExitCode), e.Result.Duration.Round(time.Millisecond).String()
					}
					return []any{e.Seq, e.State, exit, dur, formatBytes(e.OutputBytes), e.IdempotencyKey, strings.Join(e.Args, " ")}
				})
			})
		},
	}
	cmd.Flags().Uint64Var(&since, "since", 0, "only commands numbered above this")
	return cmd
}

func newBenchPauseCmd(g *globals) *cobra.Command {
	o := bench.PauseOptions{Log: os.Stderr}
	cmd := serverBenchCmd(g, "pause", "Pause levels of container sandboxes holding 64/256/1024 MiB: memory freed, pause and resume→first exec",
		`Measures freeze and reclaim on container sandboxes holding 64, 256 and 1,024 MiB
(--sizes): the share of memory each level takes out of RAM, the pause time, and the
time from a paused sandbox to its first exec's answer (the exec resumes it), beside
an exec on the running sandbox (same run) and E2B's and AgentENV's published
figures. Reclaim needs the server started with --swap SIZE (at least the largest
size); otherwise its rows say why they were not measured. On a server with the
microvm backend it also times snapshots of a running 256 MiB microVM, restores of
them into new sandboxes (beside the cold boot of the same microVM), their size on
disk, and a fork × 8 (--fork-n). For each size it also times how long until the whole working
set is in RAM again after each level (a process holding the memory, corral-probe
workingset, reads every page on the exec that resumes the sandbox), beside the same
read on the running sandbox.`,
		func(ctx context.Context, c *client.Client) (tabler, error) {
			if o.Job == 0 {
				o.Job = -1 // --job 0: skip
			}
			if o.Probe == "" {
				if exe, err := os.Executable(); err == nil {
					o.Probe = filepath.Join(filepath.Dir(exe), "corral-probe")
				}
			}
			return bench.Pause(ctx, c, o)
		})
	fl := cmd.Flags()
	fl.IntSliceVar(&o.SizesMiB, "sizes", []int{64, 256, 1024}, "MiB each sandbox holds, one sandbox per size")
	fl.IntVar(&o.N, "n", 10, "freeze samples per size")
	fl.IntVar(&o.ReclaimN, "reclaim-n", 1, "reclaim samples per size")
	fl.IntVar(&o.MicroVMN, "microvm-n", 3, "microVM snapshot and restore samples (-1: none)")
	fl.IntVar(&o.ForkN, "fork-n", 8, "sandboxes the microVM fork makes")
	fl.IntVar(&o.Job, "job", 500, "sandboxes of the job paused and resumed by label, beside one by one (0: skip)")
	fl.StringVar(&o.Probe, "probe", "", "the static corral-probe that holds the re-read working set (default: beside this binary)")
	return cmd
}

func newForkCmd(g *globals) *cobra.Command {
	var n int
	cmd := &cobra.Command{
		Use:   "fork SANDBOX",
		Short: "Make N new sandboxes starting from a sandbox as it is now (containers: its files only; microVMs: processes too)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (*client.ForkResult, error) {
				return c.Sandbox(args[0]).Fork(ctx, n)
			}, printForks)
		},
	}
	cmd.Flags().IntVarP(&n, "count", "n", 1, "forks to make (1 to 64)")
	return cmd
}

// printForks prints the new sandboxes' ids, and each failed fork to stderr.
func printForks(res *client.ForkResult) error {
	if !res.ProcessesCarried {
		fmt.Fprintf(os.Stderr, "corral: forks start from %s; processes: not carried\n", res.Image)
	}
	failed := 0
	for i, f := range res.Forks {
		if f.Err != nil {
			fmt.Fprintf(os.Stderr, "corral: fork %d: %v\n", i, f.Err)
			failed++
			continue
		}
		fmt.Println(f.Sandbox.ID())
	}
	if failed > 0 {
		return &ExitError{Code: 1}
	}
	return nil
}
