package layers

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/mountinfo"
)

func needMkfs(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		t.Skip(err)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
}

// tree writes files (path -> content; a trailing / makes a directory)
// under a new directory, every mtime fixed, and returns it.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(p, "/") {
			continue
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stamp := time.Unix(1_700_000_000, 0)
	err := filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(p, stamp, stamp)
	})
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// mountSource returns the fstype and source of the mount at mp.
func mountSource(t *testing.T, mp string) (fstype, source string) {
	t.Helper()
	mounts, err := mountinfo.Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if m.MountPoint == mp {
			fstype, source = m.FSType, m.Source
		}
	}
	return fstype, source
}

func assertMounted(t *testing.T, mp string, want bool) {
	t.Helper()
	fstype, source := mountSource(t, mp)
	if want && (fstype != "erofs" || strings.HasPrefix(source, "/dev/loop") || !strings.HasSuffix(source, ".erofs")) {
		t.Fatalf("%s: mounted %q from %q: want erofs from the image file, no loop device", mp, fstype, source)
	}
	if !want && fstype != "" {
		t.Fatalf("%s: still mounted (%s from %s)", mp, fstype, source)
	}
}

// compose records an image made of layers, base first.
func compose(t *testing.T, dir, name string, layers ...Layer) {
	t.Helper()
	b, err := json.Marshal(meta{Name: name, Env: []string{"PATH=/bin"}, Layers: layers})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name, metaFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCreateLayer(t *testing.T) {
	needMkfs(t)
	s, dir := openStore(t)
	ctx := context.Background()
	files := map[string]string{"a.txt": "alpha\n", "sub/b.txt": "beta\n", "empty/": ""}
	src := tree(t, files)
	if err := os.Chown(filepath.Join(src, "sub/b.txt"), 1000, 1001); err != nil {
		t.Fatal(err)
	}
	l1, err := s.CreateLayer(ctx, "ws@1", src)
	if err != nil {
		t.Fatal(err)
	}
	if l1.Ref != "ws@1" || !digestRE.MatchString(l1.Digest) {
		t.Fatalf("layer %+v", l1)
	}
	if _, err := os.Stat(filepath.Join(dir, "layers", "sha256-"+strings.TrimPrefix(l1.Digest, "sha256:")+".erofs")); err != nil {
		t.Fatal(err)
	}

	// Same content elsewhere, and the same tree as a tar: same digest.
	src2 := tree(t, files)
	if err := os.Chown(filepath.Join(src2, "sub/b.txt"), 1000, 1001); err != nil {
		t.Fatal(err)
	}
	l2, err := s.CreateLayer(ctx, "ws@2", src2)
	if err != nil || l2.Digest != l1.Digest {
		t.Fatalf("same content, other digest: %+v %v (want %s)", l2, err, l1.Digest)
	}
	tarFile := filepath.Join(t.TempDir(), "ws.tar")
	if out, err := exec.Command("tar", "-cf", tarFile, "--xattrs", "-C", src, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	l3, err := s.CreateLayer(ctx, "ws@3", tarFile)
	if err != nil || l3.Digest != l1.Digest {
		t.Fatalf("tar of the same tree, other digest: %+v %v (want %s)", l3, err, l1.Digest)
	}
	// Idempotent for the same content; versions are immutable.
	if l, err := s.CreateLayer(ctx, "ws@1", src2); err != nil || l != l1 {
		t.Fatalf("re-create: %+v %v", l, err)
	}
	_, err = s.CreateLayer(ctx, "ws@1", tree(t, map[string]string{"other": "x"}))
	wantErr(t, err, errdefs.ErrAlreadyExists, "ws@1 exists")

	layers, err := s.Layers(ctx)
	if err != nil || len(layers) != 3 || layers[0] != l1 || layers[2].Ref != "ws@3" {
		t.Fatalf("layers %+v %v", layers, err)
	}

	// Mounted on use: owners, content, read-only, file-backed.
	compose(t, dir, "ws", l1)
	img, err := s.Get(ctx, "ws")
	if err != nil {
		t.Fatal(err)
	}
	assertMounted(t, img.Layers[0], true)
	b, err := os.ReadFile(filepath.Join(img.Layers[0], "sub/b.txt"))
	if err != nil || string(b) != "beta\n" {
		t.Fatalf("b.txt %q %v", b, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(img.Layers[0], "sub/b.txt"), &st); err != nil || st.Uid != 1000 || st.Gid != 1001 || st.Mtim.Sec != 1_700_000_000 {
		t.Fatalf("b.txt owner %d:%d mtime %d %v", st.Uid, st.Gid, st.Mtim.Sec, err)
	}
	// Other tests on this machine may use loop devices: only ours count.
	if out, _ := exec.Command("losetup", "-a").Output(); strings.Contains(string(out), dir) {
		t.Errorf("loop devices back the store's files: %s", out)
	}
	assertNoLeftovers(t, filepath.Join(dir, "layers"))
}

func TestCreateLayerBadInput(t *testing.T) {
	needMkfs(t)
	s, dir := openStore(t)
	ctx := context.Background()
	for _, ref := range []string{"", "ws", "ws@", "@1", "WS@1", "ws@1@2", "ws@-1", "a/b@1"} {
		_, err := s.CreateLayer(ctx, ref, t.TempDir())
		wantErr(t, err, errdefs.ErrInvalidArgument, "name: ")
	}
	_, err := s.CreateLayer(ctx, "ws@1", filepath.Join(dir, "missing"))
	wantErr(t, err, errdefs.ErrInvalidArgument, "path: ")
	bad := filepath.Join(t.TempDir(), "bad.tar")
	if err := os.WriteFile(bad, []byte("not a tar file at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = s.CreateLayer(ctx, "ws@1", bad)
	wantErr(t, err, errdefs.ErrInvalidArgument, "extract tar")
	if layers, _ := s.Layers(ctx); len(layers) != 0 {
		t.Fatalf("layers after failures: %+v", layers)
	}
	assertNoLeftovers(t, filepath.Join(dir, "layers"))
}

// TestWhiteouts stacks two layers the way Docker does and mounts them as a
// sandbox would (overlayfs, lower = Image.Layers): a file deleted in the
// upper layer is gone, an opaque directory hides the lower one's files.
func TestWhiteouts(t *testing.T) {
	needMkfs(t)
	s, dir := openStore(t)
	ctx := context.Background()
	base, err := s.CreateLayer(ctx, "base@1", tree(t, map[string]string{
		"keep": "k", "gone": "g", "dir/x": "x", "opq/old": "o", "ovl/old": "o"}))
	if err != nil {
		t.Fatal(err)
	}
	// An overlay-style layer from a directory: a 0/0 char device whites
	// out, trusted.overlay.opaque=y makes a directory opaque.
	up := tree(t, map[string]string{"new": "n", "ovl/new": "n"})
	if err := unix.Mknod(filepath.Join(up, "dir"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(up, "ovl"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	ovl, err := s.CreateLayer(ctx, "ovl@1", up)
	if err != nil {
		t.Fatal(err)
	}
	// An OCI-style layer as a tar: .wh.NAME and .wh..wh..opq.
	oci := tree(t, map[string]string{".wh.gone": "", "opq/.wh..wh..opq": "", "opq/new": "n"})
	tarFile := filepath.Join(t.TempDir(), "oci.tar")
	if out, err := exec.Command("tar", "-cf", tarFile, "-C", oci, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	ociLayer, err := s.CreateLayer(ctx, "oci@1", tarFile)
	if err != nil {
		t.Fatal(err)
	}
	compose(t, dir, "stack", base, ovl, ociLayer)
	img, err := s.Get(ctx, "stack")
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Layers) != 3 || img.Layers[0] != s.layerMount(ociLayer.Digest) || img.Layers[2] != s.layerMount(base.Digest) {
		t.Fatalf("layers not topmost first: %+v", img)
	}
	checkStack(t, img.Layers, "", map[string]bool{"keep": true, "new": true, "gone": false, "dir": false, "dir/x": false,
		"opq/old": false, "opq/new": true, "ovl/old": false, "ovl/new": true})
	// fncall pool views are overlays with userxattr (mounted inside a user
	// namespace): OCI opaque directories must work there too. (The
	// overlay-style "ovl" layer carries only the trusted xattr it was
	// given.)
	checkStack(t, img.Layers, ",userxattr", map[string]bool{"keep": true, "gone": false, "dir/x": false,
		"opq/old": false, "opq/new": true})
}

// checkStack mounts layers (topmost first) as a read-only overlay with the
// extra options opts and checks which paths exist; OCI whiteout files must
// never show.
func checkStack(t *testing.T, layers []string, opts string, want map[string]bool) {
	t.Helper()
	root := t.TempDir()
	if err := unix.Mount("overlay", root, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(layers, ":")+opts); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(root, unix.MNT_DETACH)
	for p, w := range want {
		_, err := os.Lstat(filepath.Join(root, p))
		if got := err == nil; got != w {
			t.Errorf("overlay%s: %s: exists %v, want %v (%v)", opts, p, got, w, err)
		}
	}
	for _, p := range []string{".wh.gone", "opq/.wh..wh..opq"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			t.Errorf("overlay%s: OCI whiteout %s shows", opts, p)
		}
	}
}

// TestRemount: a restarted daemon finds layer mounts gone (a reboot) or
// stale (their file removed) and repairs them; Close(true) unmounts all.
func TestRemount(t *testing.T) {
	needMkfs(t)
	dir := t.TempDir()
	ctx := context.Background()
	s, err := Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(true)
	l, err := s.CreateLayer(ctx, "ws@1", tree(t, map[string]string{"f": "1"}))
	if err != nil {
		t.Fatal(err)
	}
	compose(t, dir, "ws", l)
	img, err := s.Get(ctx, "ws")
	if err != nil {
		t.Fatal(err)
	}
	mp := img.Layers[0]
	assertMounted(t, mp, true)
	// A second Open (the daemon restarted, mounts kept) changes nothing.
	if _, err := Open(ctx, dir); err != nil {
		t.Fatal(err)
	}
	assertMounted(t, mp, true)
	// The mount is gone (reboot) and a stale one is left over.
	if err := unix.Unmount(mp, 0); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "layers", "sha256-"+strings.Repeat("0", 64))
	if err := os.Mkdir(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", stale, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	assertMounted(t, mp, true)
	if fstype, _ := mountSource(t, stale); fstype != "" {
		t.Fatalf("stale mount kept: %s", fstype)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale mount point kept: %v", err)
	}
	if err := s2.Close(true); err != nil {
		t.Fatal(err)
	}
	mounted, err := mountsUnder(dir)
	if err != nil || len(mounted) != 0 {
		t.Fatalf("mounts left after Close(true): %v %v", mounted, err)
	}
	// Get after Close mounts again: lazily, on use.
	s3, err := Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close(true)
	if _, err := s3.Get(ctx, "ws"); err != nil {
		t.Fatal(err)
	}
	assertMounted(t, mp, true)
}

// TestPycStaysValid: files keep their mtimes, so a .pyc that matched its
// source still does (Python loads it), and a stale one stays stale.
func TestPycStaysValid(t *testing.T) {
	needMkfs(t)
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip(err)
	}
	s, dir := openStore(t)
	ctx := context.Background()
	src := t.TempDir()
	for name, body := range map[string]string{"good.py": "X = 1\n", "stale.py": "X = 2\n"} {
		p := filepath.Join(src, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("python3", "-m", "py_compile", p).CombinedOutput(); err != nil {
			t.Fatalf("py_compile: %v %s", err, out)
		}
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(src, "stale.py"), later, later); err != nil {
		t.Fatal(err)
	}
	tarFile := filepath.Join(t.TempDir(), "py.tar")
	if out, err := exec.Command("tar", "-cf", tarFile, "-C", src, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	l, err := s.CreateLayer(ctx, "py@1", tarFile)
	if err != nil {
		t.Fatal(err)
	}
	compose(t, dir, "py", l)
	img, err := s.Get(ctx, "py")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", "-v", "-c", "import good, stale")
	cmd.Dir = img.Layers[0]
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3: %v %s", err, out)
	}
	if !strings.Contains(string(out), "code object from '"+filepath.Join(img.Layers[0], "__pycache__", "good.")) {
		t.Errorf("good.pyc not used:\n%s", out)
	}
	if !strings.Contains(string(out), "stale.py") || !strings.Contains(string(out), "bytecode is stale") {
		t.Errorf("stale.pyc not stale:\n%s", out)
	}
}
