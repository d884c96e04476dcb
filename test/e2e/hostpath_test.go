package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// hostPathPort is this test file's TCP port (the range 17200-17299).
const hostPathPort = "127.0.0.1:17211"

// nobodyCorral copies the corral binary where uid 65534 can run it.
func nobodyCorral(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "corral-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(testenv.Binaries(t), "corral"))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "corral")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func wantCode(t *testing.T, err error, code client.Code, substr string) {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != code || !strings.Contains(err.Error(), substr) {
		t.Fatalf("got %v, want code %v with %q", err, code, substr)
	}
}

func hasLayer(t *testing.T, c *client.Client, ref string) bool {
	t.Helper()
	_, ok := findLayer(t, c, ref)
	return ok
}

// findLayer looks layer ref up in the server's image store.
func findLayer(t *testing.T, c *client.Client, ref string) (client.Layer, bool) {
	t.Helper()
	imgs, err := c.ListImages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range imgs.Layers {
		if l.Ref == ref {
			return l, true
		}
	}
	return client.Layer{}, false
}

// TestNoHostPathsOverTCP is the reproduction: an unprivileged user
// on the node, calling the TCP listener, cannot make a layer of /etc (the
// CLI streams from the caller, who cannot read /etc/shadow), and a request
// that names a node path over TCP is refused even inside --import-root.
func TestNoHostPathsOverTCP(t *testing.T) {
	importRoot := t.TempDir()
	tree := filepath.Join(importRoot, "tree")
	if err := os.MkdirAll(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "f"), []byte("node file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := testenv.StartServer(t, func(c *server.Config) { c.Listen = hostPathPort; c.ImportRoot = importRoot })
	bin := nobodyCorral(t)

	cmd := exec.Command(bin, "--addr", hostPathPort, "layer", "create", "/etc", "--name", "stolen@1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("layer create /etc as nobody over TCP succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "permission denied") {
		t.Fatalf("layer create /etc as nobody: want a permission error reading the caller's /etc, got:\n%s", out)
	}
	if hasLayer(t, srv.Client, "stolen@1") {
		t.Fatal("stolen@1 exists")
	}

	// The same call, naming the node path, over TCP with a project admin's
	// token: refused although the path is under --import-root (a TCP
	// caller is never the node admin).
	ctx := context.Background()
	mustProject(t, srv.Client, "hostpath", client.Quota{})
	_, secret, err := srv.Client.CreateToken(ctx, client.TokenOptions{Project: "hostpath", Role: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := client.New(hostPathPort, client.WithToken(secret))
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	for _, p := range []string{"/etc", tree} {
		_, err = tcp.CreateLayerFromNode(ctx, p, "stolen@1")
		wantCode(t, err, client.CodePermissionDenied, "only the node administrator")
		_, err = tcp.ImportImage(ctx, "oci:"+p, "stolen@1", client.ImportOptions{NodePath: true})
		wantCode(t, err, client.CodePermissionDenied, "only the node administrator")
		_, err = tcp.ImportImage(ctx, "docker-archive:"+p+"/f", "stolen@1", client.ImportOptions{NodePath: true})
		wantCode(t, err, client.CodePermissionDenied, "only the node administrator")
	}
	if hasLayer(t, srv.Client, "stolen@1") {
		t.Fatal("stolen@1 exists")
	}
	// The node administrator on the socket may, under the root only.
	if _, err := srv.Client.CreateLayerFromNode(ctx, tree, "tree@1"); err != nil {
		t.Fatalf("node path under --import-root on the socket: %v", err)
	}
	_, err = srv.Client.CreateLayerFromNode(ctx, "/etc", "stolen@1")
	wantCode(t, err, client.CodePermissionDenied, "not under the import root")
}

// TestImportRootEscapes: on the socket, ".." and symlinks never lead out
// of --import-root, and a server without one reads no node path at all.
func TestImportRootEscapes(t *testing.T) {
	importRoot := t.TempDir()
	for _, l := range []struct{ name, target string }{
		{"abs", "/etc"}, {"rel", "../../../../../../etc"}, {"inside", "tree"},
	} {
		if err := os.Symlink(l.target, filepath.Join(importRoot, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(importRoot, "tree", "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := testenv.StartServer(t, func(c *server.Config) { c.ImportRoot = importRoot })
	ctx := context.Background()
	for _, p := range []string{
		importRoot + "/tree/../../" + filepath.Base(importRoot) + "/../",
		importRoot + "/abs",
		importRoot + "/rel",
		importRoot + "/abs/passwd",
		"abs/shadow",
		"tree/../..",
	} {
		_, err := srv.Client.CreateLayerFromNode(ctx, p, "escape@1")
		wantCode(t, err, client.CodePermissionDenied, "leads out of the import root")
		_, err = srv.Client.ImportImage(ctx, "docker-archive:"+p, "escape@1", client.ImportOptions{NodePath: true})
		wantCode(t, err, client.CodePermissionDenied, "leads out of the import root")
	}
	if hasLayer(t, srv.Client, "escape@1") {
		t.Fatal("escape@1 exists")
	}
	// A symlink that stays inside is followed.
	if _, err := srv.Client.CreateLayerFromNode(ctx, importRoot+"/inside", "inside@1"); err != nil {
		t.Fatal(err)
	}

	plain := testenv.StartServer(t)
	_, err := plain.Client.CreateLayerFromNode(ctx, importRoot+"/tree", "x@1")
	wantCode(t, err, client.CodeFailedPrecondition, "--import-root")
}

// TestStreamedLayerSameDigest: a layer streamed from the client has the
// digest the server gives the same tree read from its own disk.
func TestStreamedLayerSameDigest(t *testing.T) {
	importRoot := t.TempDir()
	tree := filepath.Join(importRoot, "tree")
	for p, content := range map[string]string{"bin/tool": "#!/bin/sh\necho hi\n", "etc/conf": "x=1\n", "a/b/c/deep": "deep\n"} {
		full := filepath.Join(tree, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.Chmod(filepath.Join(tree, "bin/tool"), 0o750))
	must(t, os.Chown(filepath.Join(tree, "etc/conf"), 1000, 1001))
	must(t, os.Symlink("../etc/conf", filepath.Join(tree, "bin/link")))
	must(t, os.Link(filepath.Join(tree, "etc/conf"), filepath.Join(tree, "etc/hard")))
	must(t, syscall.Setxattr(filepath.Join(tree, "etc/conf"), "user.note", []byte("kept"), 0))
	must(t, os.Chmod(tree, 0o755))

	srv := testenv.StartServer(t, func(c *server.Config) { c.ImportRoot = importRoot })
	ctx := context.Background()
	node, err := srv.Client.CreateLayerFromNode(ctx, tree, "node@1")
	if err != nil {
		t.Fatal(err)
	}
	streamed, err := srv.Client.CreateLayer(ctx, tree, "streamed@1")
	if err != nil {
		t.Fatal(err)
	}
	if node.Digest != streamed.Digest {
		t.Fatalf("streamed layer %s, node path layer %s", streamed.Digest, node.Digest)
	}
	// A tar file streams as it is.
	var tarBuf bytes.Buffer
	tc := exec.Command("tar", "-c", "-C", tree, "--numeric-owner", "--xattrs", ".")
	tc.Stdout = &tarBuf
	must(t, tc.Run())
	tarFile := filepath.Join(t.TempDir(), "tree.tar")
	must(t, os.WriteFile(tarFile, tarBuf.Bytes(), 0o644))
	fromTar, err := srv.Client.CreateLayer(ctx, tarFile, "tarred@1")
	if err != nil {
		t.Fatal(err)
	}
	if fromTar.Digest != node.Digest {
		t.Fatalf("layer from a streamed tar file %s, node path layer %s", fromTar.Digest, node.Digest)
	}
	if _, err := srv.Client.CreateComposition(ctx, client.Composition{Ref: "s@1", Layers: []string{"busybox@1", "streamed@1"}}); err != nil {
		t.Fatal(err)
	}
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Image: "s@1"})
	if out := testenv.Sh(t, sb, "stat -c '%a %u:%g %h' /bin/tool /etc/conf; readlink /bin/link"); out != "750 0:0 1\n644 1000:1001 2\n../etc/conf\n" {
		t.Fatalf("streamed layer as seen in a sandbox:\n%s", out)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestStreamedImports imports an OCI layout directory and a docker save
// tarball from the client's disk into a server without --import-root.
func TestStreamedImports(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	img, err := random.Image(1<<20, 2)
	if err != nil {
		t.Fatal(err)
	}
	lp, err := layout.Write(filepath.Join(t.TempDir(), "oci"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	must(t, lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})))
	archive := filepath.Join(t.TempDir(), "saved.tar")
	tag, _ := name.NewTag("corral/test:v1")
	must(t, tarball.WriteToFile(archive, tag, img))
	want, _ := img.Digest()

	a, err := srv.Client.ImportImage(ctx, "oci:"+string(lp)+":v1", "layout@1", client.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := srv.Client.ImportImage(ctx, "docker-archive:"+archive+":corral/test:v1", "archive@1", client.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.ImageDigest != want.String() || len(a.Layers) != 2 || b.Layers[0].Digest != a.Layers[0].Digest {
		t.Fatalf("imports: layout %+v, archive %+v (image %s)", a, b, want)
	}
	// A layout smuggling a symlink to a node file is refused.
	evil := t.TempDir()
	must(t, os.CopyFS(evil, os.DirFS(string(lp))))
	blobs, _ := filepath.Glob(filepath.Join(evil, "blobs/sha256/*"))
	must(t, os.Remove(blobs[0]))
	must(t, os.Symlink("/etc/shadow", blobs[0]))
	_, err = srv.Client.ImportImage(ctx, "oci:"+evil+":v1", "evil@1", client.ImportOptions{})
	wantCode(t, err, client.CodeInvalidArgument, "not a regular file")
}
