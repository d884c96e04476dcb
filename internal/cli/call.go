package cli

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
)

func newCallCmd(g *globals) *cobra.Command {
	var (
		o              client.CallOptions
		memory, output string
		stdinFile      string
	)
	cmd := &cobra.Command{
		Use:   "call [--lang python|sh -c SOURCE | -- ARGV...]",
		Short: "Run a stateless function call in a warm, pooled sandbox (fncall)",
		Long: `Run one stateless call in a warm pooled sandbox that is reset afterwards.
Prints the call's stdout and stderr and exits with its exit code; with --json
prints the whole result (verdict, CPU and wall time, peak memory).`,
		Example: `  corral call --lang python -c 'print(1)'
  corral call --lang sh -c 'echo hi' --timeout 2s --memory 64Mi
  corral call --image busybox -- uname -a`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			o.Args = args
			if o.MemoryBytes, err = parseBytes("memory", memory); err != nil {
				return err
			}
			if o.OutputLimit, err = parseBytes("output-limit", output); err != nil {
				return err
			}
			if stdinFile != "" {
				if o.Stdin, err = os.ReadFile(stdinFile); err != nil {
					return fmt.Errorf("stdin: %w", err)
				}
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				res, err := c.Call(ctx, o)
				if err != nil {
					return err
				}
				return printCall(g, res)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Language, "lang", "", "language of -c: python or sh")
	fl.StringVarP(&o.Source, "source", "c", "", "source code to run")
	fl.StringVar(&o.Image, "image", "", "image (default busybox for sh and argv, debian for python)")
	fl.DurationVar(&o.WallTimeout, "timeout", 0, "wall time limit (default 10s)")
	fl.DurationVar(&o.CPUTimeout, "cpu-timeout", 0, "CPU time limit (default: the wall limit)")
	fl.StringVar(&memory, "memory", "", "memory limit, e.g. 256Mi (default 256Mi)")
	fl.StringVar(&output, "output-limit", "", "cap on stdout+stderr (default 1Mi)")
	fl.StringVar(&stdinFile, "stdin", "", "file whose content is the call's stdin")
	return cmd
}

// callJSON is the --json form of a call result.
type callJSON struct {
	Verdict    client.Verdict    `json:"verdict"`
	ExitCode   int               `json:"exit_code"`
	Signal     int               `json:"signal,omitempty"`
	Stdout     string            `json:"stdout"`
	Stderr     string            `json:"stderr"`
	CPUMs      float64           `json:"cpu_ms"`
	WallMs     float64           `json:"wall_ms"`
	PeakMemory int64             `json:"peak_memory_bytes"`
	Files      map[string][]byte `json:"files,omitempty"`
}

func printCall(g *globals, r *client.CallResult) error {
	if g.json {
		return printJSON(callJSON{Verdict: r.Verdict, ExitCode: r.ExitCode, Signal: r.Signal,
			Stdout: string(r.Stdout), Stderr: string(r.Stderr), CPUMs: msOf(r.CPUTime),
			WallMs: msOf(r.WallTime), PeakMemory: r.PeakMemory, Files: r.Files})
	}
	os.Stdout.Write(r.Stdout)
	os.Stderr.Write(r.Stderr)
	if r.Verdict != client.VerdictOK && r.Verdict != client.VerdictRuntimeError {
		fmt.Fprintf(os.Stderr, "corral call: %s\n", r.Verdict)
	}
	switch {
	case r.ExitCode > 0:
		return &ExitError{Code: r.ExitCode}
	case r.Verdict != client.VerdictOK:
		return &ExitError{Code: 1}
	}
	return nil
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
