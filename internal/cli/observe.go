package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
)

func newStatsCmd(g *globals) *cobra.Command {
	var noStream bool
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "stats [ID...]",
		Short: "Show sandboxes' CPU, memory, disk, PIDs and network, refreshed live (like docker stats)",
		Long: `Show sandboxes' resource use: CPU % (100 = one core), memory used/limit,
disk used/limit, PIDs and network bytes. Without IDs, every sandbox on the server.
The table refreshes every --interval until interrupted; --no-stream prints it once,
--json prints the figures (once) as JSON.`,
		RunE: func(cmd *cobra.Command, ids []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				for {
					list, err := c.Stats(ctx, client.StatsOptions{IDs: ids})
					if err != nil {
						return err
					}
					if g.json {
						return printJSON(list)
					}
					if !noStream {
						fmt.Print("\x1b[H\x1b[2J") // home and clear, as docker stats does
					}
					printStats(os.Stdout, list)
					if noStream {
						return nil
					}
					select {
					case <-ctx.Done():
						return nil
					case <-time.After(interval):
					}
				}
			})
		},
	}
	cmd.Flags().BoolVar(&noStream, "no-stream", false, "print the table once instead of refreshing it")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "refresh interval of the live table")
	return cmd
}

func printStats(w io.Writer, list []client.SandboxStats) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tBACKEND\tSTATE\tCPU %\tMEM USAGE / LIMIT\tMEM %\tDISK USAGE / LIMIT\tNET RX / TX\tPIDS")
	for _, s := range list {
		cur := s.Current
		memPct := 0.0
		if s.MemoryLimitBytes > 0 {
			memPct = float64(cur.MemoryBytes) / float64(s.MemoryLimitBytes) * 100
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f%%\t%s / %s\t%.2f%%\t%s / %s\t%s / %s\t%d\n", s.ID, s.Backend, s.State,
			cur.CPUPercent, formatBytes(cur.MemoryBytes), formatBytes(s.MemoryLimitBytes), memPct,
			formatBytes(cur.DiskBytes), formatBytes(s.DiskLimitBytes),
			formatBytes(int64(cur.NetRxBytes)), formatBytes(int64(cur.NetTxBytes)), cur.Pids)
	}
	tw.Flush()
}

func newEventsCmd(g *globals) *cobra.Command {
	var since string
	var filters []string
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Stream sandbox lifecycle events (like docker events)",
		Long: `Stream sandbox lifecycle events: created, started, paused, resumed, checkpointed,
oom_killed, exec_timed_out, idle_stopped, lifetime_reached, stopped, degraded,
network_refused, deleted. Each line starts with the event's sequence number:
--since SEQ replays the kept events after it (also across daemon restarts), then
follows live ones; --since 0 replays everything kept.

Filters (repeatable, all must match): --filter sandbox=ID, --filter type=oom_killed,
--filter project=NAME, --filter label=KEY=VALUE.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := eventOptions(since, filters)
			if err != nil {
				return err
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				for e, err := range c.Events(ctx, o) {
					if err != nil {
						return err
					}
					if g.json {
						if err := printJSONLine(e); err != nil {
							return err
						}
						continue
					}
					fmt.Println(formatEvent(e))
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&since, "since", "", "replay the kept events after this sequence number first")
	cmd.Flags().StringArrayVar(&filters, "filter", nil, "KEY=VALUE: sandbox, type, project or label (label=K=V); repeatable")
	return cmd
}

func eventOptions(since string, filters []string) (client.EventOptions, error) {
	var o client.EventOptions
	if since != "" {
		seq, err := strconv.ParseUint(since, 10, 64)
		if err != nil {
			return o, fmt.Errorf("--since: %q is not a sequence number", since)
		}
		o.After = &seq
	}
	for _, f := range filters {
		k, v, ok := strings.Cut(f, "=")
		if !ok || v == "" {
			return o, fmt.Errorf("--filter: %q is not KEY=VALUE", f)
		}
		switch k {
		case "sandbox", "id":
			o.SandboxIDs = append(o.SandboxIDs, v)
		case "type", "event":
			o.Types = append(o.Types, v)
		case "project":
			o.Project = v
		case "label":
			lk, lv, ok := strings.Cut(v, "=")
			if !ok {
				return o, fmt.Errorf("--filter label: %q is not KEY=VALUE", v)
			}
			if o.Labels == nil {
				o.Labels = map[string]string{}
			}
			o.Labels[lk] = lv
		default:
			return o, fmt.Errorf("--filter: unknown key %q (sandbox, type, project, label)", k)
		}
	}
	return o, nil
}

// formatEvent is one line: seq, time, type, sandbox, then key=value pairs.
func formatEvent(e client.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s %s %s", e.Seq, e.Time.Local().Format(time.RFC3339Nano), e.Type, e.SandboxID)
	var attrs []string
	if e.Backend != "" {
		attrs = append(attrs, "backend="+e.Backend)
	}
	if e.Project != "" {
		attrs = append(attrs, "project="+e.Project)
	}
	for k, v := range e.Figures {
		attrs = append(attrs, k+"="+strconv.FormatFloat(v, 'f', -1, 64))
	}
	for k, v := range e.Labels {
		attrs = append(attrs, "label."+k+"="+v)
	}
	sort.Strings(attrs)
	if e.Reason != "" {
		attrs = append(attrs, "reason="+strconv.Quote(e.Reason))
	}
	if len(attrs) > 0 {
		b.WriteString(" (" + strings.Join(attrs, ", ") + ")")
	}
	return b.String()
}

// printJSONLine prints v as one line of JSON (a stream of events).
func printJSONLine(v any) error {
	return json.NewEncoder(os.Stdout).Encode(v)
}
