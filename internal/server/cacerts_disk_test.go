package server

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/storage/layers"
)

// TestCALayerDisk: an image with layer disks (what microVMs attach) gets
// the CA layer as an EROFS disk on top, made once and holding the bundle;
// an image without disks gets none.
func TestCALayerDisk(t *testing.T) {
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		t.Skip("needs mkfs.erofs (package erofs-utils)")
	}
	c := testCAImages(t)
	ctx := context.Background()
	base := t.TempDir()
	img, err := c.add(ctx, layers.Image{Name: "x", Layers: []string{base}, Disks: []backend.LayerDisk{{Image: "base.erofs"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Disks) != 2 || img.Disks[1].Image != "base.erofs" || img.Disks[0].Image != img.Layers[0]+".erofs" {
		t.Fatalf("disks %+v, layers %v", img.Disks, img.Layers)
	}
	if !slices.Contains(img.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt") {
		t.Errorf("env %v", img.Env)
	}
	st, err := os.Stat(img.Disks[0].Image)
	if err != nil || st.Size() == 0 || st.Size()%4096 != 0 {
		t.Fatalf("disk %v %v", st, err)
	}
	// dump.erofs, when present, finds the bundle inside, of its size.
	if dump, err := exec.LookPath("dump.erofs"); err == nil {
		out, err := exec.Command(dump, "--path=/etc/ssl/certs/ca-certificates.crt", img.Disks[0].Image).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Size: "+strconv.Itoa(len(testCert))) {
			t.Errorf("dump.erofs: %v\n%s", err, out)
		}
	}
	again, err := c.add(ctx, layers.Image{Name: "x", Layers: []string{base}, Disks: []backend.LayerDisk{{Image: "base.erofs"}}})
	if err != nil || again.Disks[0].Image != img.Disks[0].Image {
		t.Errorf("second image: %+v %v", again.Disks, err)
	}
	plain, err := c.add(ctx, layers.Image{Name: "y", Layers: []string{base}})
	if err != nil || len(plain.Disks) != 0 {
		t.Errorf("an image without disks: %+v %v", plain.Disks, err)
	}
}
