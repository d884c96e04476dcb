package ext4img

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/upper"
	"github.com/corral-dev/corral/internal/storage/upper/loopdev"
	"golang.org/x/sys/unix"
)

func testStore(t *testing.T) *Store {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skip: needs root (loop devices, mounts)")
	}
	dir := t.TempDir()
	s, err := Open(context.Background(), Config{Dir: dir})
	if errdefs.IsNotSupported(err) {
		t.Skipf("skip: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { assertNoLoop(t, s.dir) })
	return s
}

// assertNoLoop fails if a loop device stays bound to a file under dir.
// Autoclear acts when the device's last opener closes it, which may be
// udev's probe rather than the test: hence the wait.
func assertNoLoop(t *testing.T, dir string) {
	t.Helper()
	var bound []string
	for range 200 {
		bound = bound[:0]
		devs, _ := filepath.Glob("/sys/block/loop*")
		for _, d := range devs {
			if back := loopdev.BackingFile(d); strings.HasPrefix(back, dir+"/") {
				bound = append(bound, d+" -> "+back)
			}
		}
		if len(bound) == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("leak: loop devices still bound: %v", bound)
}

func create(t *testing.T, s *Store, id string, bytes, inodes int64) upper.Layer {
	t.Helper()
	l, err := s.Create(context.Background(), id, bytes, inodes)
	if err != nil {
		t.Fatalf("Create(%s): %v", id, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// mount mounts the layer's device on a temp dir as init does, and unmounts
// it in cleanup.
func mount(t *testing.T, l upper.Layer) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount(l.DevicePath, dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "noinit_itable"); err != nil {
		t.Fatalf("mount %s: %v", l.DevicePath, err)
	}
	t.Cleanup(func() { unmount(t, dir) })
	return dir
}

func unmount(t *testing.T, dir string) {
	if err := unix.Unmount(dir, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		t.Errorf("unmount %s: %v", dir, err)
	}
}

func TestCreateRemove(t *testing.T) {
	s := testStore(t)
	ctx := context.Background()
	l := create(t, s, "a", 16<<20, 1000)
	img := filepath.Join(s.dir, "a.img")
	if !l.IsDevice() || l.Device == nil || !strings.HasPrefix(l.DevicePath, "/dev/loop") {
		t.Fatalf("layer %+v: want an open loop device", l)
	}
	if back := loopdev.BackingFile(l.DevicePath); back != img {
		t.Fatalf("%s backed by %q, want %q", l.DevicePath, back, img)
	}
	if _, err := s.Create(ctx, "a", 16<<20, 1000); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second Create: want already exists, got %v", err)
	}
	// Autoclear: closing the only user detaches the device.
	l.Close()
	if err := loopdev.WaitDetached(ctx, l.DevicePath, detachWait); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := s.Remove(ctx, "a"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Fatalf("image remains: %v", err)
	}
	if err := s.Remove(ctx, "never"); err != nil {
		t.Fatalf("Remove of unknown id: %v", err)
	}
}

func TestTemplateReuse(t *testing.T) {
	s := testStore(t)
	create(t, s, "a", 8<<20, 500)
	runs := s.mkfsRuns.Load()
	if runs == 0 {
		t.Fatal("first create ran no mkfs")
	}
	create(t, s, "b", 8<<20, 500)
	if got := s.mkfsRuns.Load(); got != runs {
		t.Fatalf("second create of the same class ran mkfs %d more times", got-runs)
	}
	create(t, s, "c", 9<<20, 500)
	if s.mkfsRuns.Load() == runs {
		t.Fatal("a new class reused another class's template")
	}
	// A reopened store (daemon restart) reuses the templates on disk.
	s2, err := Open(context.Background(), Config{Dir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	l, err := s2.Create(context.Background(), "d", 8<<20, 500)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if n := s2.mkfsRuns.Load(); n != 0 {
		t.Fatalf("reopened store ran mkfs %d times for a known class", n)
	}
}

func TestSparseCopySmall(t *testing.T) {
	s := testStore(t)
	create(t, s, "big", 1<<30, 65536)
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(s.dir, "big.img"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size < 1<<30 {
		t.Fatalf("image size %d is below the 1 GiB asked for", st.Size)
	}
	if used := st.Blocks * 512; used > 1<<20 {
		t.Fatalf("sparse copy of a 1 GiB image uses %d bytes on the host", used)
	}
	t.Logf("1 GiB / 65536 inodes image: size %d, %d KiB on the host", st.Size, st.Blocks/2)
}

func TestLimits(t *testing.T) {
	s := testStore(t)
	const limit, inodes = 16 << 20, 500
	l := create(t, s, "a", limit, inodes)
	dir := mount(t, l)
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	avail := int64(fs.Bavail) * fs.Bsize
	if avail < limit || avail > limit+(slackBlocks+layoutBlocks)*blockSize {
		t.Fatalf("usable space %d, want %d (+ at most %d)", avail, limit, (slackBlocks+layoutBlocks)*blockSize)
	}
	if fs.Ffree < inodes || fs.Ffree > 2*inodes {
		t.Fatalf("free inodes %d, want about %d", fs.Ffree, inodes)
	}
	n, err := fill(filepath.Join(dir, "fill"))
	if !errors.Is(err, unix.ENOSPC) || n < limit*95/100 || n > limit+(slackBlocks+layoutBlocks)*blockSize {
		t.Fatalf("fill: %d bytes, %v; want ENOSPC near %d", n, err, limit)
	}
	os.Remove(filepath.Join(dir, "fill"))
	var made int
	for ; made < 2*inodes; made++ {
		if err := os.Mkdir(filepath.Join(dir, fmt.Sprint(made)), 0o755); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("mkdir %d: %v", made, err)
			}
			break
		}
	}
	if made < inodes || made > inodes+64 {
		t.Fatalf("made %d directories, want ENOSPC near %d inodes", made, inodes)
	}
}

// fill appends to path until a write fails; it returns the bytes written.
func fill(path string) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := []byte(strings.Repeat("y\n", 32<<10))
	var n int64
	for n < 1<<30 {
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			return n, err
		}
	}
	return n, errors.New("wrote 1 GiB without hitting the limit")
}

func TestRemoveAfterMountLeavesNoLoop(t *testing.T) {
	s := testStore(t)
	ctx := context.Background()
	l := create(t, s, "m", 4<<20, 100)
	dir := mount(t, l)
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	l.Close() // the mount now holds the device
	if err := s.Remove(ctx, "m"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Remove while mounted: want failed precondition, got %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.dir, "m.img")); err != nil {
		t.Fatalf("image deleted while mounted: %v", err)
	}
	unmount(t, dir)
	if err := s.Remove(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	assertNoLoop(t, s.dir)
	if ids, _ := s.IDs(); len(ids) != 0 {
		t.Fatalf("IDs after Remove: %v", ids)
	}
}

func TestIDsAndLeftovers(t *testing.T) {
	s := testStore(t)
	for _, id := range []string{"x", "y"} {
		l := create(t, s, id, 2<<20, 64)
		l.Close()
	}
	for _, name := range []string{"z.img.tmp", ".templates/v1-1-1.img.tmp", "notes.txt"} {
		if err := os.WriteFile(filepath.Join(s.dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := s.IDs()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"x", "y"}) {
		t.Fatalf("IDs = %v", ids)
	}
	if _, err := Open(context.Background(), Config{Dir: s.dir}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"z.img.tmp", ".templates/v1-1-1.img.tmp"} {
		if _, err := os.Stat(filepath.Join(s.dir, name)); !os.IsNotExist(err) {
			t.Errorf("Open left %s (%v)", name, err)
		}
	}
}

func TestInvalidInput(t *testing.T) {
	s := testStore(t)
	for _, c := range []struct {
		id            string
		bytes, inodes int64
		want          string
	}{
		{"a", 1000, 100, "disk: 1000 bytes is below the minimum of 1048576"},
		{"a", MaxBytes + 1, 100, "over the maximum"},
		{"a", 1 << 20, 3, "disk inodes: 3 is below the minimum of 16"},
		{"a", 1 << 20, MaxInodes + 1, "disk inodes"},
		{"", 1 << 20, 100, "sandbox id"},
		{"../x", 1 << 20, 100, "sandbox id"},
		{".templates", 1 << 20, 100, "sandbox id"},
		{strings.Repeat("x", 300), 1 << 20, 100, "sandbox id"},
	} {
		_, err := s.Create(context.Background(), c.id, c.bytes, c.inodes)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Create(%.20q, %d, %d) = %v; want invalid argument %q", c.id, c.bytes, c.inodes, err, c.want)
		}
	}
	if err := s.Remove(context.Background(), "a/b"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Remove(a/b) = %v", err)
	}
	if _, err := Open(context.Background(), Config{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Open without dir = %v", err)
	}
}

func TestConcurrentCreates(t *testing.T) {
	s := testStore(t)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprint("c", i%4) // two creates per id
			l, err := s.Create(context.Background(), id, 2<<20, 64)
			l.Close()
			errs[i] = err
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errdefs.IsAlreadyExists(err):
			t.Errorf("Create: %v", err)
		}
	}
	if ok != 4 {
		t.Fatalf("%d creates succeeded, want one per id (4): %v", ok, errs)
	}
}

// TestTemplateSizing checks, from the superblock, that templates of very
// different shapes leave what was asked for usable.
func TestTemplateSizing(t *testing.T) {
	s := testStore(t)
	for _, c := range []class{
		{1 << 20, 16}, {1 << 20, 4096}, {16 << 20, 500}, {100 << 20, 25600},
		{1 << 30, 262144}, {3 << 30, 1000}, {64 << 20, 500000}, {5<<20 + 123, 77},
	} {
		before := s.mkfsRuns.Load()
		p, err := s.template(context.Background(), c)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		sb, err := readSuperblock(p)
		if err != nil {
			t.Fatal(err)
		}
		want := ceilDiv(c.bytes, blockSize) + layoutBlocks
		if got := sb.usableBlocks(); got < want || got > want+slackBlocks {
			t.Errorf("%+v: %d usable blocks, want %d", c, got, want)
		}
		if free := sb.freeInodes; free < c.inodes+layoutInodes {
			t.Errorf("%+v: %d free inodes", c, free)
		}
		t.Logf("%+v: %d blocks, %d usable, %d inodes; mkfs runs %d", c, sb.blocks, sb.usableBlocks(), sb.inodes, s.mkfsRuns.Load()-before)
	}
}
