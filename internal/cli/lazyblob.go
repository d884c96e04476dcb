package cli

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/storage/lazy"
)

// newLazyblobServeCmd is the node's lazy blob server process
// (lazyblob.Start runs it): hidden, it is not a user command.
func newLazyblobServeCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "lazyblob-serve",
		Short:  "Serve lazily fetched layer blobs over FUSE (started by the node; config as JSON on stdin)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return lazy.ServeStdin(ctx, os.Stdin, slog.New(slog.NewTextHandler(os.Stderr, nil)))
		},
	}
}
