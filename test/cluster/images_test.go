package cluster_test

import (
	"context"
	"crypto/rand"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/seaweed"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestLayerTravels: a layer made on node 0 is recorded in etcd and its data
// published to the shared S3 store (SeaweedFS); a create through a control
// instance pinned to node 2 (by its label) pulls the layer's metadata there
// and reads the file lazily from the store.
func TestLayerTravels(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := seaweed.Find(); err != nil {
		t.Skipf("needs SeaweedFS's weed (scripts/deps.sh): %v", err)
	}
	ctx := context.Background()
	s3, err := seaweed.Start(ctx, t.TempDir(), "corral-cluster")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s3.Stop() })
	// Not in network namespaces: the test's SeaweedFS listens on loopback.
	r := startRig(t, false, 1, 3, "--blob-store", "s3://corral-cluster?endpoint="+s3.Endpoint, "--blob-fetch-timeout", "10s")

	data := make([]byte, 3<<20)
	rand.Read(data)
	src := testenv.Tree(t, map[string][]byte{"payload": data})
	n0, err := client.New("unix://" + filepath.Join(r.nodeDir[0], "corral.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer n0.Close()
	if _, err := n0.CreateLayer(ctx, src, "travel@1"); err != nil {
		t.Fatal(err)
	}
	// The control plane's image ls shows the cluster's layer.
	deadline := time.Now().Add(20 * time.Second)
	for {
		imgs, err := r.cli[0].ListImages(ctx)
		found := false
		for _, l := range imgsLayers(imgs, err) {
			found = found || l.Ref == "travel@1"
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("control image ls never showed travel@1: %+v, %v", imgs, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	n2, err := client.New("unix://" + filepath.Join(r.nodeDir[2], "corral.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close()
	sb, err := r.cli[0].Create(ctx, client.CreateOptions{Image: "travel@1", Resources: small,
		Placement: client.Placement{NodeLabels: map[string]string{"rack": "r2"}}})
	if err != nil {
		t.Fatal(err)
	}
	if nodeOf(sb.ID()) != nodeID(t, r, 2) {
		t.Fatalf("sandbox %s is not on node 2", sb.ID())
	}
	got, err := sb.Files().Read(ctx, "/payload")
	if err != nil || string(got) != string(data) {
		t.Fatalf("payload read through the control plane: %d bytes, %v; want the %d bytes written on node 0", len(got), err, len(data))
	}
	imgs, err := n2.ListImages(ctx)
	var lazy *client.LazyBlob
	for _, l := range imgsLayers(imgs, err) {
		if l.Ref == "travel@1" {
			lazy = l.Lazy
		}
	}
	if lazy == nil || lazy.BytesFetched == 0 {
		t.Fatalf("node 2 does not read travel@1 lazily from the store: %+v", lazy)
	}

	// Pack through the control plane (it runs on node 2, where the
	// sandbox's writes are); the result starts on node 1.
	if err := sb.Files().Write(ctx, "/note", []byte("written on node 2")); err != nil {
		t.Fatal(err)
	}
	packed, err := sb.Pack(ctx, "travel-packed@1", client.PackOptions{})
	if err != nil {
		t.Fatalf("pack through the control plane: %v", err)
	}
	sb1, err := r.cli[0].Create(ctx, client.CreateOptions{Image: packed.Composition.Ref, Resources: small,
		Placement: client.Placement{NodeLabels: map[string]string{"rack": "r1"}}})
	if err != nil {
		t.Fatalf("create from the packed image on node 1: %v", err)
	}
	note, err := sb1.Files().Read(ctx, "/note")
	if err != nil || string(note) != "written on node 2" {
		t.Fatalf("packed file on node 1: %q, %v", note, err)
	}
	if got, err := sb1.Files().Read(ctx, "/payload"); err != nil || string(got) != string(data) {
		t.Fatalf("base layer's file on node 1: %d bytes, %v", len(got), err)
	}
	imageCalls(t, r)
}

// imageCalls: image calls through the control plane. A tree uploaded
// there is built into a layer on some node and recorded for the cluster;
// a composition of it made there starts on node 2; removing it there
// removes it from every node and from the cluster's records; the calls
// that are one node's are refused saying where to run them.
func imageCalls(t *testing.T, r *rig) {
	ctx := context.Background()
	c := r.cli[0]
	src := testenv.Tree(t, map[string][]byte{"hello": []byte("uploaded through the control plane")})
	if _, err := c.CreateLayer(ctx, src, "uploaded@1"); err != nil {
		t.Fatalf("layer upload through the control plane: %v", err)
	}
	comp, err := c.CreateComposition(ctx, client.Composition{Ref: "upstack@1", Layers: []string{"travel@1", "uploaded@1"}})
	if err != nil || comp.Ref != "upstack@1" {
		t.Fatalf("composition through the control plane: %+v, %v", comp, err)
	}
	sb, err := c.Create(ctx, client.CreateOptions{Image: "upstack@1", Resources: small,
		Placement: client.Placement{NodeLabels: map[string]string{"rack": "r2"}}})
	if err != nil {
		t.Fatalf("create from the composition made through the control plane: %v", err)
	}
	if got, err := sb.Files().Read(ctx, "/hello"); err != nil || string(got) != "uploaded through the control plane" {
		t.Fatalf("uploaded file on node 2: %q, %v", got, err)
	}
	if err := c.Delete(ctx, sb.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RemoveImage(ctx, "upstack@1"); err != nil {
		t.Fatalf("remove through the control plane: %v", err)
	}
	imgs, err := c.ListImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, cp := range imgs.Compositions {
		if cp.Ref == "upstack@1" {
			t.Fatal("control image ls still shows upstack@1 after its removal")
		}
	}
	for i := range r.nodes {
		n, err := client.New("unix://" + filepath.Join(r.nodeDir[i], "corral.sock"))
		if err != nil {
			t.Fatal(err)
		}
		imgs, err := n.ListImages(ctx)
		n.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, cp := range imgs.Compositions {
			if cp.Ref == "upstack@1" {
				t.Fatalf("node %d still has upstack@1 after its removal through the control plane", i)
			}
		}
	}
	if _, err := c.RemoveImage(ctx, "upstack@1"); !client.IsNotFound(err) {
		t.Fatalf("second removal: %v, want not found", err)
	}
	if _, err := c.CollectGarbage(ctx); !client.IsUnimplemented(err) || !strings.Contains(err.Error(), "run it on the node") {
		t.Fatalf("collect garbage through the control plane: %v, want a refusal saying where to run it", err)
	}
}

func imgsLayers(imgs *client.Images, err error) []client.Layer {
	if err != nil || imgs == nil {
		return nil
	}
	return imgs.Layers
}

// nodeID is the id of the rig's node i (by its cluster address).
func nodeID(t *testing.T, r *rig, i int) string {
	nodes, err := r.cli[0].ClusterNodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Address == r.nodeAddr(i) {
			return n.ID
		}
	}
	t.Fatalf("no node %d in %+v", i, nodes)
	return ""
}
