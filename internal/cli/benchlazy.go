package cli

import (
	"context"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/bench"
)

func newBenchLazyCmd(g *globals) *cobra.Command {
	o := bench.LazyOptions{Log: os.Stderr}
	var chunkSizes []string
	cmd := benchCmd(g, "lazy", "Lazy image loading from S3 (SeaweedFS): fetched fraction, 64-start burst vs eager pull, warm start vs local",
		`Measure lazy image loading on this host (needs root, FUSE, EROFS and the
weed binary from scripts/deps.sh; no server).

The debian image (python3) is split into EROFS metadata and a chunked data
blob, published to a SeaweedFS S3 store started for the run and read through
a modelled link (--bandwidth, --latency). A start mounts the metadata with
the lazy blob file as its device and runs the command chrooted in it.
Peers in the same run: the same burst after downloading the whole blob
first (eager), and warm starts against the blob fully local.`,
		func(ctx context.Context) (tabler, error) {
			for _, s := range chunkSizes {
				n, err := parseBytes("chunk-sizes", s)
				if err != nil {
					return nil, err
				}
				o.ChunkSizes = append(o.ChunkSizes, n)
			}
			return bench.Lazy(ctx, o)
		})
	fl := cmd.Flags()
	fl.StringSliceVar(&chunkSizes, "chunk-sizes", []string{"256Ki", "512Ki", "1Mi", "4Mi"}, "fetch chunk sizes measured for the cold start")
	sizeVar(cmd, &o.ChunkSize, "chunk-size", "512Ki", "fetch chunk size of the burst and warm phases")
	sizeVar(cmd, &o.BytesPerSec, "bandwidth", "50Mi", "bytes/s of the modelled link to the store, shared by all fetches")
	fl.DurationVar(&o.Latency, "latency", 10*time.Millisecond, "per-request latency of the modelled link")
	fl.IntVar(&o.Starts, "starts", 64, "starts in the burst")
	fl.IntVar(&o.WarmN, "warm-n", 20, "warm-start samples (each side)")
	fl.StringVar(&o.Rootfs, "rootfs", "", "tree to serve instead of the debian image (must have the command)")
	fl.StringVar(&o.ImageDir, "image-dir", "", "image store for the debian image, kept between runs (default /var/tmp/corral-bench-lazy/images)")
	fl.StringVar(&o.WorkDir, "work-dir", "", "parent of the run's scratch dir (default /var/tmp)")
	return cmd
}
