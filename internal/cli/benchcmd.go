package cli

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
)

// The scaffolding every `corral bench` subcommand shares: no arguments,
// Ctrl-C and SIGTERM cancel the measurement (the benchmark then deletes
// what it made), and the result goes to stdout as a table or, with
// --json, as JSON.

// tabler is a benchmark result: printed as a table, or as JSON with --json.
type tabler interface{ WriteTable(w io.Writer) error }

// benchCmd makes a bench subcommand that runs measure, which needs no
// server (it starts what it measures itself).
func benchCmd(g *globals, use, short, long string, measure func(ctx context.Context) (tabler, error)) *cobra.Command {
	return newBench(use, short, long, func(cmd *cobra.Command) error { return measureAndPrint(cmd, g, measure) })
}

// serverBenchCmd makes a bench subcommand that measures the server --addr
// names.
func serverBenchCmd(g *globals, use, short, long string, measure func(ctx context.Context, c *client.Client) (tabler, error)) *cobra.Command {
	return newBench(use, short, long, func(cmd *cobra.Command) error { return runBench(cmd, g, measure) })
}

func newBench(use, short, long string, run func(cmd *cobra.Command) error) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return run(cmd) },
	}
}

// runBench runs one benchmark against the server with a client of its own
// and prints its result (nothing when it failed: progress on stderr shows
// how far it got).
func runBench(cmd *cobra.Command, g *globals, run func(ctx context.Context, c *client.Client) (tabler, error)) error {
	return g.withClient(cmd, func(_ context.Context, c *client.Client) error {
		return measureAndPrint(cmd, g, func(ctx context.Context) (tabler, error) { return run(ctx, c) })
	})
}

// measureAndPrint runs measure with Ctrl-C and SIGTERM cancelling its
// context and prints its result.
func measureAndPrint(cmd *cobra.Command, g *globals, measure func(ctx context.Context) (tabler, error)) error {
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := measure(ctx)
	if err != nil {
		return err
	}
	if g.json {
		return printJSON(res)
	}
	return res.WriteTable(os.Stdout)
}

// sizeFlag is a flag holding a byte size ("64Mi", "2Gi", "1000000"),
// parsed when it is set, so that a bad value fails before anything runs.
type sizeFlag struct {
	p    *int64
	text string
}

// sizeVar defines a size flag on cmd storing into p, with def (a constant)
// as its default.
func sizeVar(cmd *cobra.Command, p *int64, name, def, usage string) {
	f := &sizeFlag{p: p}
	if err := f.Set(def); err != nil {
		panic(err) // a default is a constant of this package
	}
	cmd.Flags().Var(f, name, usage)
}

func (f *sizeFlag) Set(s string) error {
	n, err := parseSize(s) // the flag set names the flag
	if err != nil {
		return err
	}
	*f.p, f.text = n, s
	return nil
}

func (f *sizeFlag) String() string { return f.text }

// Type is "string" so that help shows the flag as before: a string with a
// quoted default.
func (f *sizeFlag) Type() string { return "string" }
