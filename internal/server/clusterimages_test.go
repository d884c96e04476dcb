package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/control"
	"github.com/corral-dev/corral/internal/etcdembed"
	image "github.com/corral-dev/corral/internal/storage/layers"
)

// TestRemovedImageStaysRemoved: a composition removed from the cluster
// (every node, then its records) while another node keeps creating
// sandboxes from it (pulling it from the records) and syncing its images
// to the cluster is gone afterwards: no node's sync records it again, and
// no node pulled it back after its removal there. Real etcd, real image
// stores; the removal is the control plane's, the node side the nodes'.
func TestRemovedImageStaysRemoved(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (image stores mount their layers)")
	}
	ctx := context.Background()
	e, err := etcdembed.StartCluster(ctx, t.TempDir(), 1, 17220, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := cluster.Dial(e.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("base"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Two nodes: a has the composition first; b pulls it (its layer is
	// local on both, so no blob store is needed).
	var nodes []nodeImages
	for _, id := range []string{"na", "nb"} {
		st, err := image.Open(ctx, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close(true) })
		if _, err := st.CreateLayer(ctx, "base@1", src); err != nil {
			t.Fatal(err)
		}
		ci := &clusterImages{etcd: cli, images: st, node: id, log: log}
		nodes = append(nodes, nodeImages{inner: control.NewImageService(nil, st, nil), ci: ci})
	}
	a, b := nodes[0], nodes[1]
	removers := []imageRemover{{node: "na", remove: a.RemoveImage}, {node: "nb", remove: b.RemoveImage}}
	for round := range 30 {
		ref := fmt.Sprintf("job@%d", round)
		if _, err := a.ci.images.CreateComposition(ctx, image.Composition{Ref: ref, Layers: []string{"base@1"}}); err != nil {
			t.Fatal(err)
		}
		if err := a.ci.sync(ctx); err != nil {
			t.Fatal(err)
		}
		// Node b: creates from ref and its periodic sync, over and over,
		// until the removal is done.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = b.ci.prepare(ctx, &corralv1.CreateRequest{Image: ref})
				_ = b.ci.sync(ctx)
			}
		}()
		_, err := removeFromCluster(ctx, cli, &corralv1.RemoveImageRequest{Name: ref}, removers)
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("round %d: remove %s: %v", round, ref, err)
		}
		for _, n := range nodes {
			if err := n.ci.sync(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := n.ci.images.Get(ctx, ref); err == nil {
				t.Fatalf("round %d: node %s has %s again after its removal from the cluster", round, n.ci.node, ref)
			}
		}
		resp, err := cli.Get(ctx, compositionRecords+ref)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 0 {
			t.Fatalf("round %d: %s is recorded again (by %s) after its removal from the cluster", round, ref, resp.Kvs[0].Value)
		}
		// A removed name may be made again, and is recorded again.
		if round == 0 {
			if _, err := b.ci.images.CreateComposition(ctx, image.Composition{Ref: ref, Layers: []string{"base@1"}}); err != nil {
				t.Fatal(err)
			}
			if err := b.ci.sync(ctx); err != nil {
				t.Fatal(err)
			}
			if resp, err := cli.Get(ctx, compositionRecords+ref); err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("%s made again on nb is not recorded: %v, %v", ref, resp, err)
			}
			if _, err := removeFromCluster(ctx, cli, &corralv1.RemoveImageRequest{Name: ref}, removers); err != nil {
				t.Fatal(err)
			}
		}
	}
}
