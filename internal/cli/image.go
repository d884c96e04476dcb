package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/image"
)

func newImageCmd() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build and list images on this machine",
	}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", "/var/lib/corral", "the daemon's data directory")
	build := &cobra.Command{
		Use:   "build NAME",
		Short: "Build a built-in image: busybox (instant) or debian (Debian 12 + python3 + git, about a minute)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			store, err := image.Open(cmd.Context(), filepath.Join(dataDir, "images"))
			if err != nil {
				return err
			}
			img, err := store.Build(cmd.Context(), args[0], os.Stderr)
			if err != nil {
				return err
			}
			fmt.Println(img.Name)
			return nil
		},
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List built images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store, err := image.Open(cmd.Context(), filepath.Join(dataDir, "images"))
			if err != nil {
				return err
			}
			imgs, err := store.List(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tLAYERS")
			for _, img := range imgs {
				fmt.Fprintf(tw, "%s\t%d\n", img.Name, len(img.Layers))
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(build, ls)
	return cmd
}
