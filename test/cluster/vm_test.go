package cluster_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestClusterVM drives VMService through a control instance of a
// two-node cluster: VM image calls go to the node they name (or are
// refused, naming the field, when two nodes could hold it); a vm create
// lands on the node that has the image, and its screenshot and live view
// (the websocket forwarded to the node) work through the control
// instance; calls for a sandbox of an unknown node name the node.
func TestClusterVM(t *testing.T) {
	testenv.RequireVMImage(t)
	r := startRig(t, false, 1, 2)
	c := r.cli[0]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	n0, n1 := nodeID(t, r, 0), nodeID(t, r, 1)

	if _, err := c.Screenshot(ctx, "nosuchnode-0123abcd", 0); !client.IsNotFound(err) || !strings.Contains(err.Error(), "nosuchnode") {
		t.Errorf("screenshot on an unknown node: %v, want not_found naming the node", err)
	}
	if _, err := c.LiveView(ctx, "nosuchnode-0123abcd", 0); !client.IsNotFound(err) || !strings.Contains(err.Error(), "nosuchnode") {
		t.Errorf("live view on an unknown node: %v, want not_found naming the node", err)
	}

	// Images: each node's own.
	disk := filepath.Join(t.TempDir(), "d.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, "32M").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if _, err := c.VMImagesOn("").Import(ctx, openFile(t, disk), "blank@1", "bios"); !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "node") {
		t.Errorf("import without a node in a cluster of two: %v, want invalid_argument naming node", err)
	}
	im, err := c.VMImagesOn(n1).Import(ctx, openFile(t, disk), "blank@1", "bios")
	if err != nil || im.Node != n1 || im.Ref != "blank@1" {
		t.Fatalf("import on node %s: %+v, %v", n1, im, err)
	}
	testenv.AdoptVMImage(t, r.nodeDir[0], "debian@cluster")
	all, err := c.ListVMImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	where := map[string]string{}
	for _, im := range all {
		where[im.Ref] = im.Node
	}
	if len(all) != 2 || where["blank@1"] != n1 || where["debian@cluster"] != n0 {
		t.Errorf("cluster listing: %+v, want blank@1 on %s and debian@cluster on %s", all, n1, n0)
	}
	if on0, err := c.VMImagesOn(n0).List(ctx); err != nil || len(on0) != 1 || on0[0].Ref != "debian@cluster" {
		t.Errorf("listing of node %s: %+v, %v", n0, on0, err)
	}
	if err := c.VMImagesOn(n0).Remove(ctx, "blank@1"); !client.IsNotFound(err) {
		t.Errorf("remove from the node without it: %v, want not_found", err)
	}
	if err := c.VMImagesOn(n1).Remove(ctx, "blank@1"); err != nil {
		t.Errorf("remove on node %s: %v", n1, err)
	}

	// A VM on node 0, driven through the control instance.
	sb, err := c.Create(ctx, client.CreateOptions{Backend: "vm", Image: "debian@cluster",
		Resources: client.Resources{CPUMillis: 1000, MemoryBytes: 512 << 20},
		Placement: client.Placement{NodeLabels: map[string]string{"rack": "r0"}}})
	if err != nil {
		t.Fatalf("create vm through the control instance: %v", err)
	}
	defer sb.Delete(context.Background())
	if nodeOf(sb.ID()) != n0 {
		t.Fatalf("vm on node %s, want %s", nodeOf(sb.ID()), n0)
	}
	shot, err := c.Screenshot(ctx, sb.ID(), 0)
	if err != nil || shot.Width == 0 || len(shot.PNG) == 0 {
		t.Fatalf("screenshot through the control instance: %dx%d, %v", shot.Width, shot.Height, err)
	}
	lv, err := c.LiveView(ctx, sb.ID(), 0)
	if err != nil {
		t.Fatalf("live view through the control instance: %v", err)
	}
	sock := r.controlSocket(0)
	dialer := websocket.Dialer{HandshakeTimeout: time.Minute, NetDialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	// A wrong token is refused by the node, and the control instance says so.
	_, resp, err := dialer.DialContext(ctx, "ws://control"+lv.Path+"?token="+lv.Token+"x", nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("wrong token through the control instance: %v, %v; want HTTP 403", resp, err)
	}
	resp.Body.Close()
	ws, _, err := dialer.DialContext(ctx, "ws://control"+lv.URLPath(), nil)
	if err != nil {
		t.Fatalf("open the live view through the control instance: %v", err)
	}
	defer ws.Close()
	w, h, rw, rh := testenv.RFBFirstFrame(t, ws)
	if rw == 0 || rh == 0 {
		t.Fatalf("first rectangle %dx%d", rw, rh)
	}
	t.Logf("live view through the control instance: %dx%d, first rectangle %dx%d", w, h, rw, rh)
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.AssertWSClosed(t, ws, "the delete (through the control instance)")
}

func openFile(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
