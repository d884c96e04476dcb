// Package cli is the `corral` command line: it parses flags, talks to a
// server through the Go SDK (package client), and starts the server for
// `corral serve`. Logic lives below it; this package only adapts.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
)

// globals are the flags every client command shares.
type globals struct {
	addr string
	json bool
}

// ExitError carries a process exit code out of a command (used by exec/run
// to exit with the sandboxed command's code).
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// NewRoot builds the root command.
func NewRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "corral",
		Short: "corral runs disposable sandboxes for training and evaluating AI agents",
		Long: `corral runs disposable sandboxes for training and evaluating AI agents.

Start a server with 'corral serve', then create sandboxes and run commands:
  corral run -- echo hello            # one-off: create, run, delete
  id=$(corral create --image debian)  # a sandbox that stays
  corral exec $id -- python3 -c 'print(1+1)'
  corral rm $id`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	defAddr := os.Getenv("CORRAL_ADDR")
	if defAddr == "" {
		defAddr = client.DefaultAddress
	}
	root.PersistentFlags().StringVar(&g.addr, "addr", defAddr, "server address: unix:///path.sock or host:port (env CORRAL_ADDR; on TCP a token from CORRAL_TOKEN)")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print machine-readable JSON")
	root.AddCommand(
		newServeCmd(),
		newCreateCmd(g), newRunCmd(g), newExecCmd(g), newLsCmd(g), newGetCmd(g),
		newRmCmd(g), newCpCmd(g), newPauseCmd(g), newResumeCmd(g), newNetCmd(g), newExecsCmd(g), newForkCmd(g), newSnapshotCmd(g), newRestoreCmd(g), newSnapshotsCmd(g), newMigrateCmd(g),
		newImageCmd(g),
		newLayerCmd(g),
		newPackCmd(g),
		newCallCmd(g),
		newBenchCmd(g),
		newLazyblobServeCmd(),
		newStatsCmd(g), newEventsCmd(g),
		newTokenCmd(g), newProjectCmd(g), newWhoAmICmd(g), newAuditCmd(g),
		newEtcdCmd(), newNodesCmd(g), newNodeCmd(g),
		newVMImageCmd(g), newScreenshotCmd(g), newInputCmd(g), newLiveViewCmd(g),
	)
	return root
}

// Main runs the CLI and returns the process exit code.
func Main(ctx context.Context, args []string) int {
	root := NewRoot()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var exit *ExitError
	if errors.As(err, &exit) {
		return exit.Code
	}
	fmt.Fprintln(os.Stderr, "corral:", describe(err))
	return 1
}

// describe turns an error into a sentence a person can act on.
func describe(err error) string {
	msg := err.Error()
	var ce *client.Error
	if errors.As(err, &ce) {
		msg = ce.Message + " (" + string(ce.Code) + ")"
	}
	if client.IsUnavailable(err) {
		msg += "\n  is the server running? start it with 'corral serve' or point --addr / CORRAL_ADDR at it"
	}
	if client.IsUnauthenticated(err) {
		msg += "\n  TCP calls need a token: set CORRAL_TOKEN (root makes one on the node: corral token create --project P)"
	}
	return msg
}

func (g *globals) client() (*client.Client, error) { return newClient(g.addr) }

// withClient dials the server and runs f with the command's context.
func (g *globals) withClient(cmd *cobra.Command, f func(ctx context.Context, c *client.Client) error) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	defer c.Close()
	return f(cmd.Context(), c)
}

// fetch dials the server, gets one value and prints it: as JSON under
// --json, else with text.
func fetch[T any](cmd *cobra.Command, g *globals, get func(context.Context, *client.Client) (T, error), text func(T) error) error {
	return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
		v, err := get(ctx, c)
		if err != nil {
			return err
		}
		if g.json {
			return printJSON(v)
		}
		return text(v)
	})
}

// printTable prints header and a line of format for each row, the
// tab-separated columns aligned.
func printTable[T any](header, format string, rows []T, cols func(T) []any) error {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintf(tw, format, cols(r)...)
	}
	return tw.Flush()
}

// printLine is a text printer for fetch: one line, of what line picks.
func printLine[T any](line func(T) any) func(T) error {
	return func(v T) error {
		_, err := fmt.Println(line(v))
		return err
	}
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(jsonView(v)) // the API's field names, [] not null: see jsonview.go
}
