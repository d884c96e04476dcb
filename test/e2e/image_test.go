package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// workspace makes a layer ws@1 (a directory on the node) and the
// composition env@1 = busybox@1 + ws@1.
func workspace(t *testing.T, c *client.Client) {
	t.Helper()
	ctx := context.Background()
	dir := testenv.Tree(t, map[string][]byte{"data/keep": []byte("keep\n"), "data/gone": []byte("gone\n"), "data/olddir/x": []byte("x\n"), "data/shared": []byte("lower\n")})
	l, err := c.CreateLayer(ctx, dir, "ws@1")
	if err != nil {
		t.Fatal(err)
	}
	if l.BlobDigest == "" || l.MetaSize == 0 {
		t.Fatalf("layer not split: %+v", l)
	}
	if _, err := c.CreateComposition(ctx, client.Composition{Ref: "env@1", Layers: []string{"busybox@1", "ws@1"},
		Env: []string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin"}}); err != nil {
		t.Fatal(err)
	}
}

// TestLayersSharedWritesPrivate: two sandboxes from one composition see
// its layers and only their own writes; a layer they use cannot be
// removed, and is removable once they are gone.
func TestLayersSharedWritesPrivate(t *testing.T) {
	srv := testenv.StartServer(t)
	c := srv.Client
	ctx := context.Background()
	workspace(t, c)
	a := testenv.NewSandbox(t, c, client.CreateOptions{Image: "env@1"})
	b := testenv.NewSandbox(t, c, client.CreateOptions{Image: "env@1"})
	testenv.Sh(t, a, "echo a > /data/shared; echo mine > /data/a-only; rm /data/gone")
	testenv.Sh(t, b, "echo b > /data/shared")
	if out := testenv.Sh(t, a, "cat /data/shared /data/keep; ls /data"); out != "a\nkeep\na-only\nkeep\nolddir\nshared\n" {
		t.Errorf("sandbox a sees %q", out)
	}
	if out := testenv.Sh(t, b, "cat /data/shared; ls /data"); out != "b\ngone\nkeep\nolddir\nshared\n" {
		t.Errorf("sandbox b sees %q", out)
	}

	_, err := c.RemoveImage(ctx, "ws@1")
	if !client.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "composition env@1") ||
		!strings.Contains(err.Error(), a.ID()) || !strings.Contains(err.Error(), b.ID()) {
		t.Fatalf("remove a layer in use: %v", err)
	}
	if _, err := c.RemoveImage(ctx, "env@1"); err != nil {
		t.Fatal(err)
	}
	rm, err := c.CollectGarbage(ctx)
	if err != nil || len(rm.Layers) != 0 {
		t.Fatalf("gc with the layer in use: %+v %v", rm, err)
	}
	if _, err := c.RemoveImage(ctx, "ws@1"); !client.IsFailedPrecondition(err) {
		t.Fatalf("remove a layer sandboxes use: %v", err)
	}
	for _, sb := range []*client.Sandbox{a, b} {
		if err := sb.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rm, err = c.RemoveImage(ctx, "ws@1")
	if err != nil || len(rm.Deleted) != 1 || rm.FreedBytes == 0 {
		t.Fatalf("remove an unused layer: %+v %v", rm, err)
	}
	imgs, err := c.ListImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range imgs.Layers {
		if l.Ref == "ws@1" {
			t.Fatal("ws@1 still listed")
		}
	}
}

// TestPackBranches packs a running sandbox (deletions, a replaced
// directory, a large random file) and starts two sandboxes from the pack:
// they have the packed files byte for byte, and none of the excluded
// residue. A stopped sandbox packs too. It runs on both disk stores: the
// pack's snapshot is a reflink copy on the XFS pool, a copy out of the
// sandbox's ext4 image otherwise.
func TestPackBranches(t *testing.T) {
	for _, store := range []string{server.DiskStoreAuto, server.DiskStoreExt4Image} {
		t.Run(store, func(t *testing.T) { testPackBranches(t, store) })
	}
}

func testPackBranches(t *testing.T, store string) {
	srv := testenv.StartServer(t, func(c *server.Config) { c.DiskStore = store })
	c := srv.Client
	ctx := context.Background()
	workspace(t, c)
	sb := testenv.NewSandbox(t, c, client.CreateOptions{Image: "env@1"})
	big := make([]byte, 3<<20+17)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	if err := sb.Files().Write(ctx, "/work/big.bin", big); err != nil {
		if err := sb.Files().MakeDir(ctx, "/work", true); err != nil {
			t.Fatal(err)
		}
		if err := sb.Files().Write(ctx, "/work/big.bin", big); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Sh(t, sb, `rm /data/gone; rm -r /data/olddir; mkdir /data/olddir; echo y > /data/olddir/y
		ln -s /data/keep /work/link; chmod 600 /data/keep
		echo junk > /tmp/junk; echo 'ls' > /root/.ash_history; mkdir -p /home/u; echo h > /home/u/.bash_history
		echo secret > /work/excluded-by-flag`)
	packed, err := sb.Pack(ctx, "branch@1", client.PackOptions{Exclude: []string{"/work/excluded-*"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "busybox@1 ws@1 branch@1"; strings.Join(packed.Composition.Layers, " ") != want {
		t.Fatalf("composition %+v, want layers %s", packed.Composition, want)
	}
	if info, err := sb.Info(ctx); err != nil || info.State != client.StateRunning {
		t.Fatalf("after pack: %+v %v", info, err)
	}
	testenv.Sh(t, sb, "echo after > /work/after-pack")

	for range 2 {
		br := testenv.NewSandbox(t, c, client.CreateOptions{Image: "branch@1"})
		got, err := br.Files().Read(ctx, "/work/big.bin")
		if err != nil || !bytes.Equal(got, big) {
			t.Fatalf("big.bin: %d bytes (want %d), equal %v, %v", len(got), len(big), bytes.Equal(got, big), err)
		}
		script := `for p in /data/keep /data/gone /data/olddir/x /data/olddir/y /work/link /tmp/junk /root/.ash_history /home/u/.bash_history /work/excluded-by-flag /work/after-pack; do
			if [ -e $p ]; then echo "$p yes"; else echo "$p no"; fi; done
			stat -c %a /data/keep; readlink /work/link; cat /data/olddir/y`
		want := strings.Join([]string{"/data/keep yes", "/data/gone no", "/data/olddir/x no", "/data/olddir/y yes",
			"/work/link yes", "/tmp/junk no", "/root/.ash_history no", "/home/u/.bash_history no",
			"/work/excluded-by-flag no", "/work/after-pack no", "600", "/data/keep", "y", ""}, "\n")
		if out := testenv.Sh(t, br, script); out != want {
			t.Errorf("branch sees:\n%s\nwant:\n%s", out, want)
		}
		testenv.Sh(t, br, "echo mine > /work/branch-only")
	}

	// A stopped sandbox packs as it was.
	life := 2 * time.Second
	st := testenv.NewSandbox(t, c, client.CreateOptions{Image: "busybox", MaxLifetime: &life})
	testenv.Sh(t, st, "echo stopped > /root/state")
	waitStopped(t, st, "max_lifetime")
	if _, err := st.Pack(ctx, "stopped@1", client.PackOptions{}); err != nil {
		t.Fatal(err)
	}
	again := testenv.NewSandbox(t, c, client.CreateOptions{Image: "stopped@1"})
	if out := testenv.Sh(t, again, "cat /root/state"); out != "stopped\n" {
		t.Errorf("from the stopped pack: %q", out)
	}

	_, err = sb.Pack(ctx, "branch@1", client.PackOptions{})
	if client.CodeOf(err) != client.CodeAlreadyExists {
		t.Errorf("pack onto an existing version: %v", err)
	}
	// A name only a composition has is taken too, and no layer is made.
	if _, err := c.CreateComposition(ctx, client.Composition{Ref: "taken@1", Layers: []string{"busybox@1"}}); err != nil {
		t.Fatal(err)
	}
	_, err = sb.Pack(ctx, "taken@1", client.PackOptions{})
	if client.CodeOf(err) != client.CodeAlreadyExists {
		t.Errorf("pack onto a composition's name: %v", err)
	}
	imgs, err := c.ListImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range imgs.Layers {
		if l.Ref == "taken@1" {
			t.Errorf("a refused pack made layer %+v", l)
		}
	}
	_, err = sb.Pack(ctx, "bad", client.PackOptions{})
	if !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "name") {
		t.Errorf("pack with a bad name: %v", err)
	}
	_, err = sb.Pack(ctx, "x@1", client.PackOptions{Exclude: []string{"relative"}})
	if !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "exclude[") {
		t.Errorf("pack with a bad exclude: %v", err)
	}
}
