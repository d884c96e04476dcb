package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/storage/layers"
)

func newImageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build, import, list and remove images, compositions and layers",
		Long: `Images are stacks of read-only EROFS layers. A layer is NAME@VERSION; a
composition NAME@VERSION stacks layers (base first) into an environment; a
built image (busybox, debian) is made on this machine from a recipe. Create a
sandbox from any of them: --image busybox, --image task@3, --image tool@2.`,
	}
	cmd.AddCommand(newImageBuildCmd(g), newImageLsCmd(g), newImageImportCmd(g),
		newImageComposeCmd(g), newImageRmCmd(g), newImageGCCmd(g), newImagePullCmd(g))
	return cmd
}

func newImageBuildCmd(g *globals) *cobra.Command {
	var localDir string
	var rebuild bool
	build := &cobra.Command{
		Use:   "build NAME",
		Short: "Have the daemon build a built-in image: busybox (instant) or debian (Debian 12 + python3 + git, about a minute)",
		Long: `Have the daemon build a built-in image into its own store (whatever its
--data-dir): busybox (instant) or debian (Debian 12 + python3 + git, about a
minute), streaming the build's output. Only the node administrator may (root
on the daemon's unix socket). An image built by an earlier version as one
EROFS file (no separate data blob) keeps working; --rebuild makes it afresh
in the split format (only while no sandbox uses it).

--local-data-dir DIR builds offline, with no daemon, straight into the store
under DIR: only for a daemon that is not running.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if localDir != "" {
				return buildLocal(cmd, localDir, args[0], rebuild)
			}
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (*client.BuiltImage, error) {
				return c.BuildImage(ctx, args[0], client.BuildOptions{Rebuild: rebuild, Output: os.Stderr})
			}, printLine(func(img *client.BuiltImage) any { return img.Name }))
		},
	}
	build.Flags().StringVar(&localDir, "local-data-dir", "", "offline: build into this data directory without a daemon (never while one uses it)")
	build.Flags().BoolVar(&rebuild, "rebuild", false, "build afresh and replace the existing image")
	return build
}

// buildLocal builds name into the store under dataDir in this process.
func buildLocal(cmd *cobra.Command, dataDir, name string, rebuild bool) error {
	store, err := layers.Open(cmd.Context(), filepath.Join(dataDir, "images"))
	if err != nil {
		return err
	}
	build := store.Build
	if rebuild {
		build = store.Rebuild
	}
	img, err := build(cmd.Context(), name, os.Stderr)
	if err != nil {
		return err
	}
	fmt.Println(img.Name)
	return nil
}

func newImageLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List built images, compositions and layers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (*client.Images, error) {
				return c.ListImages(ctx)
			}, printImages)
		},
	}
}

// printImages is the table of image ls: built images, compositions, layers.
func printImages(imgs *client.Images) error {
	var rows [][]any
	for _, b := range imgs.Built {
		refs := make([]string, len(b.Layers))
		for i, l := range b.Layers {
			refs[i] = l.Ref
		}
		rows = append(rows, []any{"image", b.Name, strings.Join(refs, " "), "", "", ""})
	}
	for _, comp := range imgs.Compositions {
		rows = append(rows, []any{"composition", comp.Ref, strings.Join(comp.Layers, " "), "", "", ""})
	}
	for _, l := range imgs.Layers {
		blob := "-"
		if l.BlobDigest != "" {
			blob = formatBytes(l.BlobSize)
		}
		rows = append(rows, []any{"layer", l.Ref, shortDigest(l.Digest), formatBytes(l.MetaSize), blob, lazyColumn(l.Lazy)})
	}
	return printTable("KIND\tNAME\tLAYERS / DIGEST\tMETA\tBLOB\tLAZY", "%s\t%s\t%s\t%s\t%s\t%s\n", rows, func(r []any) []any { return r })
}

// lazyColumn summarizes a lazily read blob: "-" when the node has it whole.
func lazyColumn(z *client.LazyBlob) string {
	if z == nil {
		return "-"
	}
	out := fmt.Sprintf("fetched %s, chunks %d/%d, hit rate %.0f%%", formatBytes(z.BytesFetched), z.ChunksPresent, z.ChunksTotal, 100*z.HitRate)
	if z.Fault != "" {
		out += ", fault: " + z.Fault
	}
	return out
}

func newImagePullCmd(g *globals) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "pull DIGEST",
		Short: "Learn a layer another node published to the shared blob store (metadata only; data is fetched on read)",
		Long: `Learn a layer another node published to the blob store both nodes share
(corral serve --blob-store). Only the layer's metadata is copied; file data is
fetched chunk by chunk when a sandbox first reads it. DIGEST is the layer
digest the publishing node lists (corral image ls --json).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (client.Layer, error) {
				return c.PullLayer(ctx, args[0], name)
			}, func(l client.Layer) error {
				fmt.Printf("%s %s (metadata %s local, blob %s lazy)\n", l.Ref, l.Digest, formatBytes(l.MetaSize), formatBytes(l.BlobSize))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "NAME@VERSION to record the layer under here (default: the name it was published under)")
	return cmd
}

func shortDigest(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}

func newImageImportCmd(g *globals) *cobra.Command {
	var name string
	var insecure, quiet, nodePath bool
	cmd := &cobra.Command{
		Use:   "import SOURCE --name NAME@VERSION",
		Short: "Import an OCI image from a registry, an OCI layout dir or a docker save tarball",
		Long: `Import an OCI image as the composition NAME@VERSION, one EROFS layer per image
layer. SOURCE is a registry reference (host/repo:tag or host/repo@sha256:...),
oci:DIR[:REF] (an OCI image layout) or docker-archive:FILE[:REPO:TAG] (a
docker save tarball); a layout or tarball is read here and streamed to the
server (with --node-path it is a path on the server's machine instead: for
root on the unix socket only, under corral serve --import-root). Importing
an image again (by manifest digest) converts and stores nothing.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			src := args[0]
			for _, prefix := range []string{layers.SourceOCILayout, layers.SourceDockerArchive} {
				if rest, ok := strings.CutPrefix(src, prefix); ok && !strings.HasPrefix(rest, "/") && !nodePath {
					if abs, err := filepath.Abs(rest); err == nil {
						src = prefix + abs
					}
				}
			}
			bar := newImportBar(quiet || g.json)
			res, err := c.ImportImage(cmd.Context(), src, name, client.ImportOptions{Insecure: insecure, Progress: bar.update, NodePath: nodePath})
			bar.finish()
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(res)
			}
			state := "imported"
			if res.Cached {
				state = "already imported"
			}
			fmt.Printf("%s %s (%s, %d layers)\n", res.Composition.Ref, state, res.ImageDigest, len(res.Layers))
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the composition's NAME@VERSION, e.g. python@3.11")
	cmd.Flags().BoolVar(&insecure, "insecure", false, "allow a registry over plain HTTP")
	cmd.Flags().BoolVar(&nodePath, "node-path", false, "the oci:/docker-archive: path is on the server's machine (node administrator only, under --import-root)")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

// importBar draws an import's progress on stderr: one step per layer,
// with the bytes read so far.
type importBar struct {
	off   bool
	bar   *progressbar.ProgressBar
	start time.Time
}

func newImportBar(off bool) *importBar { return &importBar{off: off, start: time.Now()} }

func (b *importBar) update(p client.ImportProgress) {
	if b.off || p.Layers == 0 {
		return
	}
	if b.bar == nil {
		b.bar = progressbar.NewOptions(p.Layers, progressbar.OptionSetWriter(os.Stderr),
			progressbar.OptionSetWidth(30), progressbar.OptionShowCount(), progressbar.OptionSetElapsedTime(true),
			progressbar.OptionThrottle(100*time.Millisecond))
	}
	what := "converting"
	if p.Cached {
		what = "cached"
	}
	b.bar.Describe(fmt.Sprintf("layer %d/%d %s, %s read", p.Layer, p.Layers, what, formatBytes(p.Bytes)))
	_ = b.bar.Set(p.Layer - 1)
}

func (b *importBar) finish() {
	if b.bar != nil {
		_ = b.bar.Finish()
		fmt.Fprintln(os.Stderr)
	}
}

func newImageComposeCmd(g *globals) *cobra.Command {
	var env []string
	cmd := &cobra.Command{
		Use:   "compose NAME@VERSION LAYER...",
		Short: "Record a composition: layers stacked base first (LAYER is NAME@VERSION, or NAME for its latest version)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (client.Composition, error) {
				return c.CreateComposition(ctx, client.Composition{Ref: args[0], Layers: args[1:], Env: env})
			}, printLine(func(comp client.Composition) any { return comp.Ref }))
		},
	}
	cmd.Flags().StringArrayVarP(&env, "env", "e", nil, "default environment KEY=VALUE (repeatable; default PATH only)")
	return cmd
}

func newImageRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove built images, compositions and layers (a layer in use is kept and named in the error)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				for _, name := range args {
					rm, err := c.RemoveImage(ctx, name)
					if err != nil {
						return err
					}
					printRemoved(rm)
				}
				return nil
			})
		},
	}
}

func newImageGCCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "gc",
		Short: "Remove every layer no sandbox, composition or image uses (older versions included)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (*client.Removed, error) {
				return c.CollectGarbage(ctx)
			}, printRemoved)
		},
	}
}

func printRemoved(rm *client.Removed) error {
	for _, n := range rm.Images {
		fmt.Println("removed image", n)
	}
	for _, n := range rm.Compositions {
		fmt.Println("removed composition", n)
	}
	for _, l := range rm.Layers {
		fmt.Println("removed layer", l.Ref, l.Digest)
	}
	_, err := fmt.Printf("deleted %d layer files, freed %s\n", len(rm.Deleted), formatBytes(rm.FreedBytes))
	return err
}

func newLayerCmd(g *globals) *cobra.Command {
	var name string
	var nodePath bool
	cmd := &cobra.Command{
		Use:   "layer",
		Short: "Build read-only EROFS layers",
	}
	create := &cobra.Command{
		Use:   "create PATH --name NAME@VERSION",
		Short: "Build a layer from a directory or a tar file, streamed to the server (owners, modes and xattrs kept; mtimes set to 0) and print its digest",
		Long: `Build a layer from a directory or a tar file read here and streamed to the
server as a tar. With --node-path, PATH is on the server's machine instead:
only root on the unix socket may name one, and only under the directory
corral serve --import-root names (no ".." or symlink may lead out of it).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (client.Layer, error) {
				if nodePath {
					return c.CreateLayerFromNode(ctx, args[0], name)
				}
				path, err := filepath.Abs(args[0])
				if err != nil {
					return client.Layer{}, err
				}
				return c.CreateLayer(ctx, path, name)
			}, printLine(func(l client.Layer) any { return l.Digest }))
		},
	}
	create.Flags().StringVar(&name, "name", "", "the layer's NAME@VERSION, e.g. workspace@3")
	create.Flags().BoolVar(&nodePath, "node-path", false, "PATH is on the server's machine (node administrator only, under --import-root)")
	_ = create.MarkFlagRequired("name")
	cmd.AddCommand(create)
	return cmd
}

func newPackCmd(g *globals) *cobra.Command {
	var name string
	var o client.PackOptions
	cmd := &cobra.Command{
		Use:   "pack SANDBOX --name NAME@VERSION",
		Short: "Turn a sandbox's writes into a new layer, and a composition to start new sandboxes from",
		Long: `Pack a running (paused meanwhile) or stopped sandbox's writable layer into the
layer NAME@VERSION; deletions stay deletions. By default it also records the
composition NAME@VERSION: the sandbox's own layers with the new one on top, so
that 'corral create --image NAME@VERSION' starts where the sandbox is now.
Left out by default: ` + strings.Join(layers.DefaultPackExcludes, " "),
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return fetch(cmd, g, func(ctx context.Context, c *client.Client) (*client.Packed, error) {
				return c.Sandbox(args[0]).Pack(ctx, name, o)
			}, func(res *client.Packed) error {
				fmt.Printf("layer %s %s (%s data)\n", res.Layer.Ref, res.Layer.Digest, formatBytes(res.Layer.BlobSize))
				if res.Composition.Ref != "" {
					fmt.Printf("composition %s: %s\n", res.Composition.Ref, strings.Join(res.Composition.Layers, " "))
				}
				return nil
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&name, "name", "", "the new layer's NAME@VERSION")
	fl.StringArrayVar(&o.Exclude, "exclude", nil, "also leave out this absolute path (* and ? match within a component; repeatable)")
	fl.BoolVar(&o.NoDefaultExcludes, "no-default-excludes", false, "keep what the default exclusions leave out")
	fl.BoolVar(&o.NoComposition, "no-composition", false, "make only the layer")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}
