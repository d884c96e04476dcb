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
			// One line per layer, base first; the name on the first.
			tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tLAYER\tDIGEST")
			for _, img := range imgs {
				for i, l := range img.Stack {
					name := ""
					if i == 0 {
						name = img.Name
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\n", name, l.Ref, l.Digest)
				}
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(build, ls)
	return cmd
}

func newLayerCmd() *cobra.Command {
	var dataDir, name string
	cmd := &cobra.Command{
		Use:   "layer",
		Short: "Build read-only EROFS layers on this machine",
	}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", "/var/lib/corral", "the daemon's data directory")
	create := &cobra.Command{
		Use:   "create PATH --name NAME@VERSION",
		Short: "Build a layer from a directory or a tar file (owners, modes and xattrs kept; mtimes set to 0) and print its digest",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			store, err := image.Open(cmd.Context(), filepath.Join(dataDir, "images"))
			if err != nil {
				return err
			}
			l, err := store.CreateLayer(cmd.Context(), name, args[0])
			if err != nil {
				return err
			}
			fmt.Println(l.Digest)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "the layer's NAME@VERSION, e.g. workspace@3")
	_ = create.MarkFlagRequired("name")
	cmd.AddCommand(create)
	return cmd
}
