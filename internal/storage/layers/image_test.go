package layers

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

func openStore(t *testing.T, opts ...Option) (*Store, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(context.Background(), dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(true); err != nil {
			t.Error(err)
		}
	})
	return s, dir
}

func wantErr(t *testing.T, err error, class error, want string) {
	t.Helper()
	if !errors.Is(err, class) || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v: want class %v mentioning %q", err, class, want)
	}
}

func TestBusybox(t *testing.T) {
	if _, err := findBusybox(); err != nil {
		t.Skip(err)
	}
	s, dir := openStore(t)
	ctx := context.Background()
	var progress bytes.Buffer
	img, err := s.Build(ctx, "busybox", &progress)
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != "busybox" || len(img.Layers) != 1 || len(img.Stack) != 1 || img.Stack[0].Ref != "busybox@1" ||
		img.Layers[0] != filepath.Join(dir, "layers", "sha256-"+strings.TrimPrefix(img.Stack[0].Digest, "sha256:")) ||
		!strings.HasPrefix(img.Env[0], "PATH=") {
		t.Fatalf("image %+v", img)
	}
	rootfs := img.Layers[0]
	assertMounted(t, rootfs, true)
	if _, err := os.Stat(filepath.Join(dir, "busybox", "rootfs")); !os.IsNotExist(err) {
		t.Fatalf("the build's rootfs directory is left: %v", err)
	}
	if !strings.Contains(progress.String(), "applets") {
		t.Fatalf("progress %q", progress.String())
	}
	// The copied binary runs, and bin/sh is one of its applets.
	out, err := exec.Command(filepath.Join(rootfs, "bin/busybox"), "sh", "-c", "echo hi").Output()
	if err != nil || string(out) != "hi\n" {
		t.Fatalf("busybox sh: %q %v", out, err)
	}
	// Real dates (zip refuses mtimes before 1980): the host binary's.
	host, _ := findBusybox()
	hostSt, err := os.Stat(host)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".", "bin/busybox", "etc/passwd"} {
		st, err := os.Stat(filepath.Join(rootfs, p))
		if err != nil || !st.ModTime().Equal(hostSt.ModTime()) {
			t.Fatalf("%s mtime %v, want the host busybox's %v (%v)", p, st.ModTime(), hostSt.ModTime(), err)
		}
	}
	if dst, err := os.Readlink(filepath.Join(rootfs, "bin/sh")); err != nil || dst != "/bin/busybox" {
		t.Fatalf("bin/sh -> %q %v", dst, err)
	}
	passwd, _ := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
	if !strings.Contains(string(passwd), "nobody:x:65534:65534:") {
		t.Fatalf("passwd %q", passwd)
	}
	if st, err := os.Stat(filepath.Join(rootfs, "tmp")); err != nil || st.Mode() != os.ModeDir|os.ModeSticky|0o777 {
		t.Fatalf("tmp: %v %v", st.Mode(), err)
	}

	// Read-only.
	if err := os.WriteFile(filepath.Join(rootfs, "stamp"), nil, 0o644); err == nil {
		t.Fatal("wrote into a layer")
	}

	// Cached: a second Build returns the image; Rebuild makes it again,
	// and the busybox recipe is reproducible: the same digest.
	again, err := s.Build(ctx, "busybox", nil)
	if err != nil || again.Stack[0] != img.Stack[0] {
		t.Fatalf("Build again: %+v %v", again, err)
	}
	re, err := s.Rebuild(ctx, "busybox", &progress)
	if err != nil || re.Stack[0] != img.Stack[0] {
		t.Fatalf("Rebuild: %+v %v (was %+v)", re, err, img.Stack[0])
	}
	assertNoLeftovers(t, dir)
	assertNoLeftovers(t, filepath.Join(dir, "layers"))
}

func assertNoLeftovers(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			t.Fatalf("leftover %s", e.Name())
		}
	}
}

func TestGetList(t *testing.T) {
	if _, err := findBusybox(); err != nil {
		t.Skip(err)
	}
	s, dir := openStore(t)
	ctx := context.Background()
	_, err := s.Get(ctx, "busybox")
	wantErr(t, err, errdefs.ErrNotFound, "image \"busybox\" not found (have: none); build it with `corral image build busybox`")
	if _, err := s.Build(ctx, "busybox", nil); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "notanimage"), 0o755); err != nil {
		t.Fatal(err)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "busybox" {
		t.Fatalf("list %+v %v", list, err)
	}
	img, err := s.Get(ctx, "busybox")
	if err != nil || img.Layers[0] != list[0].Layers[0] {
		t.Fatalf("get %+v %v", img, err)
	}
	_, err = s.Get(ctx, "debian")
	wantErr(t, err, errdefs.ErrNotFound, "image \"debian\" not found (have: busybox); build it with `corral image build debian`")
	_, err = s.Get(ctx, "ubuntu")
	wantErr(t, err, errdefs.ErrNotFound, "(built images: busybox; buildable: busybox, debian")
	_, err = s.Build(ctx, "ubuntu", nil)
	wantErr(t, err, errdefs.ErrNotFound, "no recipe")
}

func TestInvalidNames(t *testing.T) {
	s, _ := openStore(t)
	ctx := context.Background()
	for _, name := range []string{"", "Busybox", ".hidden", "-x", "a/b", "..", "a b", strings.Repeat("a", 65), ".tmp-busybox-1", "layers"} {
		_, err := s.Get(ctx, name)
		wantErr(t, err, errdefs.ErrInvalidArgument, "name")
		_, err = s.Build(ctx, name, nil)
		wantErr(t, err, errdefs.ErrInvalidArgument, "name")
	}
	for _, name := range []string{"a", "python3.12", "swe_bench-1", strings.Repeat("a", 64)} {
		if err := checkName(name); err != nil {
			t.Errorf("%q: %v", name, err)
		}
	}
}

func TestOpenSweepsInterruptedBuilds(t *testing.T) {
	dir := t.TempDir()
	left := filepath.Join(dir, tmpPrefix+"debian-123", "rootfs", "etc")
	if err := os.MkdirAll(left, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "layers", tmpPrefix+"tar-1", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "layers", tmpPrefix+"layer-1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(true)
	assertNoLeftovers(t, dir)
	assertNoLeftovers(t, filepath.Join(dir, "layers"))
}

// TestDebian builds the debian image with mmdebstrap (about a minute, from
// the host's apt sources).
func TestDebian(t *testing.T) {
	if os.Getenv("CORRAL_TEST_DEBIAN") != "1" {
		t.Skip("slow (about a minute, needs mmdebstrap and apt access): set CORRAL_TEST_DEBIAN=1 to run")
	}
	s, dir := openStore(t)
	start := time.Now()
	img, err := s.Build(context.Background(), "debian", testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	rootfs := img.Layers[0]
	t.Logf("built debian in %v: %d MiB", time.Since(start).Round(time.Second), treeSize(t, rootfs)>>20)
	for _, p := range []string{"usr/bin/python3", "usr/bin/git", "usr/bin/ps", "usr/bin/less", "etc/ssl/certs/ca-certificates.crt"} {
		if _, err := os.Stat(filepath.Join(rootfs, p)); err != nil {
			t.Errorf("missing %s: %v", p, err)
		}
	}
	passwd, _ := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
	if !strings.Contains(string(passwd), "\nnobody:") {
		t.Error("no nobody user")
	}
	// Run the image's python in it (chroot: the image's own libc).
	out, err := exec.Command("chroot", rootfs, "/usr/bin/python3", "-c", "print(6*7)").CombinedOutput()
	if err != nil || string(out) != "42\n" {
		t.Errorf("python3 in the image: %q %v", out, err)
	}
	assertNoLeftovers(t, dir)
}

// treeSize sums the sizes of the regular files under dir.
func treeSize(t *testing.T, dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		n += info.Size()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
