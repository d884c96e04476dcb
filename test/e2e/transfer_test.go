package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/backend/backendtest"
	"github.com/corral-dev/corral/internal/bench"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestCopyTreeRoundTrip copies a random tree (small and big files,
// symlinks, hard links, modes, owners, mtimes, xattrs) into a sandbox and
// back out; the copy matches the original byte for byte and in metadata,
// and the sandbox sees the owners and links as they were. `corral bench
// transfer` does the same with 1 GiB.
func TestCopyTreeRoundTrip(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "tree")
	st, err := bench.MakeTree(src, 24<<20, 1)
	if err != nil {
		t.Fatal(err)
	}
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Image: "busybox"})
	got, err := sb.Files().UploadDir(ctx, src, "/work/tree")
	if err != nil {
		t.Fatal(err)
	}
	if got.Bytes != st.Bytes {
		t.Fatalf("upload wrote %d bytes, the tree has %d", got.Bytes, st.Bytes)
	}
	// Owners as the sandbox sees them, hard links and symlinks as made.
	out := testenv.Sh(t, sb, "cd /work/tree/src/d0 && stat -c '%n %u:%g %h' f1 f3 && readlink f4.rel && readlink f5.abs && ls -l f3.hard | cut -c1-10")
	if want := "f1 1000:1000 1\nf3 0:0 2\nf3\n/etc/hostname\n-r--r--r--\n"; out != want {
		t.Fatalf("in the sandbox:\n%s\nwant:\n%s", out, want)
	}
	downloadMatches(ctx, t, sb, "/work/tree", src)
}

// randomData is n random bytes and their sha256 in hex.
func randomData(n int) ([]byte, string) {
	data := make([]byte, n)
	rand.Read(data)
	sum := sha256.Sum256(data)
	return data, hex.EncodeToString(sum[:])
}

// downloadMatches downloads dir from sb and fails the test unless it is
// the host tree src, bytes and metadata.
func downloadMatches(ctx context.Context, t *testing.T, sb *client.Sandbox, dir, src string) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "back")
	if err := sb.Files().DownloadDir(ctx, dir, dst); err != nil {
		t.Fatal(err)
	}
	if err := bench.CompareTrees(src, dst); err != nil {
		t.Fatal(err)
	}
}

// TestCopyInNeverEscapes: tar entries with "..", absolute names, symlinks
// that point out and hard links to node files all stay inside the sandbox.
func TestCopyInNeverEscapes(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Image: "busybox"})
	hostDir := t.TempDir()
	canary := filepath.Join(hostDir, "canary")
	if err := os.WriteFile(canary, []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The same path inside the sandbox, where the symlink case lands.
	testenv.Sh(t, sb, "mkdir -p "+hostDir)
	type entry = backendtest.TarEntry
	upload := func(es ...entry) error {
		_, err := sb.Files().UploadTar(ctx, "/in", backendtest.TarOf(t, es...))
		return err
	}
	for _, es := range [][]entry{
		{{Hdr: tar.Header{Name: "../../../../" + hostDir + "/dotdot", Typeflag: tar.TypeReg, Mode: 0o644}, Body: "x"}},
		{{Hdr: tar.Header{Name: hostDir + "/abs", Typeflag: tar.TypeReg, Mode: 0o644}, Body: "x"}},
		{{Hdr: tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: hostDir}, Body: ""},
			{Hdr: tar.Header{Name: "out/through", Typeflag: tar.TypeReg, Mode: 0o644}, Body: "x"}},
	} {
		if err := upload(es...); err != nil {
			t.Fatalf("upload %s: %v", es[len(es)-1].Hdr.Name, err)
		}
	}
	// A hard link to a node file: its target is looked up in the sandbox.
	err := upload(entry{Hdr: tar.Header{Name: "hard", Typeflag: tar.TypeLink, Linkname: "../../../../" + canary}, Body: ""})
	wantCode(t, err, client.CodeNotFound, "canary")
	if names, _ := os.ReadDir(hostDir); len(names) != 1 {
		t.Fatalf("host dir %s has %d entries after the copies: %v", hostDir, len(names), names)
	}
	if b, _ := os.ReadFile(canary); string(b) != "host\n" {
		t.Fatalf("canary changed: %q", b)
	}
	testenv.Sh(t, sb, fmt.Sprintf("test -f /in%[1]s/dotdot && test -f /in%[1]s/abs && test -L /in/out && test -f %[1]s/through && ! test -e /in/hard", hostDir))
}

// TestStreamedStdinAndUpload: exec stdin and file uploads past the old
// 16 MiB and 80 MiB message caps arrive whole.
func TestStreamedStdinAndUpload(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Image: "busybox"})
	data, want := randomData(96 << 20)
	res, err := sb.Run(ctx, client.Command{Shell: "sha256sum | cut -d' ' -f1", StdinReader: bytes.NewReader(data)})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != want {
		t.Fatalf("stdin of %d bytes: exit %d, sha256 %q, want %s (stderr %q)", len(data), res.ExitCode, res.Stdout, want, res.Stderr)
	}
	n, err := sb.Files().WriteFrom(ctx, "/big", bytes.NewReader(data), 0o600)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("upload: %d bytes, %v", n, err)
	}
	if out := testenv.Sh(t, sb, "sha256sum /big | cut -d' ' -f1; stat -c %a /big"); out != want+"\n600\n" {
		t.Fatalf("uploaded file: %q", out)
	}
}

// TestMicroVMTransfer: on a microVM, stdin, single files and directory
// trees stream as on a container.
func TestMicroVMTransfer(t *testing.T) {
	srv := startMicroVMServer(t)
	ctx := context.Background()
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: "microvm",
		Resources: client.Resources{MemoryBytes: 256 << 20, CPUMillis: 1000}})
	data, want := randomData(24 << 20)
	res, err := sb.Run(ctx, client.Command{Shell: "sha256sum | cut -d' ' -f1", StdinReader: bytes.NewReader(data)})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != want {
		t.Fatalf("streamed stdin on a microVM: %+v, %v", res, err)
	}
	if _, err := sb.Files().WriteFrom(ctx, "/root/big", bytes.NewReader(data), 0); err != nil {
		t.Fatal(err)
	}
	if out := testenv.Sh(t, sb, "sha256sum /root/big | cut -d' ' -f1"); out != want+"\n" {
		t.Fatalf("uploaded file on a microVM: %q", out)
	}
	// Trees round-trip through the guest agent as through a container.
	src := filepath.Join(t.TempDir(), "tree")
	tree, err := bench.MakeTree(src, 4<<20, 1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := sb.Files().UploadDir(ctx, src, "/root/tree")
	if err != nil || got.Bytes != tree.Bytes {
		t.Fatalf("upload a tree to a microVM: %+v, %v; the tree has %d bytes", got, err, tree.Bytes)
	}
	downloadMatches(ctx, t, sb, "/root/tree", src)
}

// TestCLICopyTree: `corral cp` of a directory follows docker cp's naming
// (into an existing directory under the source's name, else as the
// destination) and round-trips the tree.
func TestCLICopyTree(t *testing.T) {
	srv := testenv.StartServer(t)
	bin := filepath.Join(testenv.Binaries(t), "corral")
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Image: "busybox"})
	tmp := t.TempDir()
	src := filepath.Join(tmp, "repo")
	if _, err := bench.MakeTree(src, 2<<20, 2); err != nil {
		t.Fatal(err)
	}
	cp := func(from, to string) {
		t.Helper()
		if out, err := exec.Command(bin, "--addr", srv.Addr, "cp", from, to).CombinedOutput(); err != nil {
			t.Fatalf("corral cp %s %s: %v\n%s", from, to, err, out)
		}
	}
	testenv.Sh(t, sb, "mkdir /work")
	cp(src, sb.ID()+":/work")  // /work exists: /work/repo
	cp(src, sb.ID()+":/fresh") // /fresh does not: it is the copy
	testenv.Sh(t, sb, "test -d /work/repo/big && test -d /fresh/big && ! test -e /fresh/repo")
	cp(sb.ID()+":/work/repo", tmp+"/back") // ./back does not exist: it is the copy
	if err := bench.CompareTrees(src, tmp+"/back"); err != nil {
		t.Fatal(err)
	}
}
