package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestVMServiceThroughTheAPI: VM images are imported (streamed from the
// client), listed and removed through the SDK; a non-disk is refused; a
// container sandbox has no screen. (Booting vm sandboxes is tested in
// internal/backend/vm, which shares one VM between its tests.)
func TestVMServiceThroughTheAPI(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("vm: needs qemu-img (package qemu-utils)")
	}
	srv := testenv.StartServer(t)
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	disk := filepath.Join(t.TempDir(), "d.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, "32M").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	im, err := c.ImportVMImage(ctx, f, "blank@1", "uefi")
	f.Close()
	if err != nil || im.Ref != "blank@1" || im.Format != "qcow2" || im.VirtualSize != 32<<20 || im.Firmware != "uefi" {
		t.Fatalf("import: %+v, %v", im, err)
	}
	if _, err := c.ImportVMImage(ctx, strings.NewReader(strings.Repeat("not a disk\n", 200)), "junk@1", "bios"); !client.IsInvalidArgument(err) {
		t.Errorf("import of a text file: %v, want invalid_argument", err)
	}
	ims, err := c.ListVMImages(ctx)
	if err != nil || len(ims) != 1 || ims[0].Ref != "blank@1" {
		t.Errorf("list: %+v, %v", ims, err)
	}
	if err := c.RemoveVMImage(ctx, "blank@1"); err != nil {
		t.Errorf("rm: %v", err)
	}
	if err := c.RemoveVMImage(ctx, "blank@1"); !client.IsNotFound(err) {
		t.Errorf("rm again: %v, want not_found", err)
	}
	// Creating from a missing VM image says so before anything is made.
	if _, err := c.Create(ctx, client.CreateOptions{Backend: "vm", Image: "nosuch@1"}); !client.IsNotFound(err) {
		t.Errorf("create from a missing vm image: %v, want not_found", err)
	}

	sb := testenv.NewSandbox(t, c, client.CreateOptions{})
	if _, err := c.Screenshot(ctx, sb.ID(), 0); !client.IsUnimplemented(err) {
		t.Errorf("screenshot of a container: %v, want unimplemented", err)
	}
	if err := c.SendInput(ctx, sb.ID(), client.TypeText("x")); !client.IsUnimplemented(err) {
		t.Errorf("input to a container: %v, want unimplemented", err)
	}
}
