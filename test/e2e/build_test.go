package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/client"
)

// TestBuildImageThroughDaemon: `corral image build` is an API call. The
// daemon builds into its own data dir (not /var/lib/corral), streams the
// recipe's output, and refuses any caller but its administrator.
func TestBuildImageThroughDaemon(t *testing.T) {
	srv, addr := startTCP(t)
	ctx := context.Background()
	var out bytes.Buffer
	img, err := srv.Client.BuildImage(ctx, "busybox", client.BuildOptions{Rebuild: true, Output: &out})
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != "busybox" || len(img.Layers) != 1 || img.Layers[0].Ref != "busybox@1" || len(img.Env) == 0 {
		t.Fatalf("built %+v", img)
	}
	if !strings.Contains(out.String(), "applets") {
		t.Errorf("no build output streamed: %q", out.String())
	}
	if _, err := os.Stat(filepath.Join(srv.Config.DataDir, "images", "busybox", "image.json")); err != nil {
		t.Errorf("not built into the daemon's data dir: %v", err)
	}
	// A sandbox starts from the rebuilt image.
	sb, err := srv.Client.Create(ctx, client.CreateOptions{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	_ = sb.Delete(ctx)

	_, err = srv.Client.BuildImage(ctx, "nosuch", client.BuildOptions{})
	if !client.IsNotFound(err) || !strings.Contains(err.Error(), "no recipe") {
		t.Errorf("unknown recipe: %v", err)
	}
	_, err = srv.Client.BuildImage(ctx, "", client.BuildOptions{})
	if !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "name") {
		t.Errorf("no name: %v", err)
	}
	mustProject(t, srv.Client, "builders", client.Quota{MaxSandboxes: 1})
	admin := tokenClient(t, srv.Client, addr, "builders", "admin")
	if _, err := admin.BuildImage(ctx, "busybox", client.BuildOptions{}); !client.IsPermissionDenied(err) {
		t.Errorf("a project admin's token built an image: %v", err)
	}
}
