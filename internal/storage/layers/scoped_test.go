package layers

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// resident counts the pages of path that are in the page cache, through
// a mapping of it (mincore), as a sandbox would probe.
func resident(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+4095)/4096)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestMountScopes: the same layer acquired in two scopes is two mounts,
// each a superblock of its own: a file read through one is not resident
// through the other, while the shared mount stays what it was. The
// scoped mounts survive a reopen (reconcile keeps them) and go with
// their layer.
func TestMountScopes(t *testing.T) {
	if _, err := findBusybox(); err != nil {
		t.Skip(err)
	}
	// Without the warm, which reads every file of a new mount (see
	// TestWarmAfterMount) and would hide whose read made a page resident.
	s, dir := openStore(t, WithWarmBudget(0))
	ctx := context.Background()
	shared, err := s.Build(ctx, "busybox", nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.AcquireIn(ctx, "busybox", "sandbox-a", MountScope("alpha"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.AcquireIn(ctx, "busybox", "sandbox-b", MountScope("beta"))
	if err != nil {
		t.Fatal(err)
	}
	if a.Layers[0] == b.Layers[0] || a.Layers[0] == shared.Layers[0] || filepath.Dir(a.Layers[0]) != filepath.Join(dir, "layers") {
		t.Fatalf("mount points: shared %s, alpha %s, beta %s", shared.Layers[0], a.Layers[0], b.Layers[0])
	}
	var sa, sb unix.Stat_t
	_ = unix.Stat(a.Layers[0], &sa)
	_ = unix.Stat(b.Layers[0], &sb)
	if sa.Dev == sb.Dev {
		t.Fatalf("alpha and beta mounts share device %d: one superblock", sa.Dev)
	}
	if _, err := s.AcquireIn(ctx, "busybox", "sandbox-c", "../x"); err == nil {
		t.Fatal("a scope that is not MountScope's was accepted")
	}
	file := "etc/passwd"
	if n := resident(t, filepath.Join(b.Layers[0], file)); n != 0 {
		t.Fatalf("%s resident through beta's mount before anyone read it: %d pages", file, n)
	}
	if _, err := os.ReadFile(filepath.Join(a.Layers[0], file)); err != nil {
		t.Fatal(err)
	}
	if n := resident(t, filepath.Join(a.Layers[0], file)); n == 0 {
		t.Fatalf("%s not resident through alpha's mount after reading it: mincore shows nothing", file)
	}
	if n := resident(t, filepath.Join(b.Layers[0], file)); n != 0 {
		t.Errorf("alpha's read is visible through beta's mount: %d pages resident", n)
	}

	// A reopen (a daemon restart) keeps the scoped mounts.
	if err := s.Close(false); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, dir, WithWarmBudget(0))
	if err != nil {
		t.Fatal(err)
	}
	assertMounted(t, a.Layers[0], true)
	s2.Release("sandbox-a")
	s2.Release("sandbox-b")
	if err := s2.unmountLayer(shared.Stack[0].Digest); err != nil {
		t.Fatal(err)
	}
	for _, mp := range []string{shared.Layers[0], a.Layers[0], b.Layers[0]} {
		if _, err := os.Stat(mp); !os.IsNotExist(err) {
			t.Errorf("mount point %s left after the layer's unmount: %v", mp, err)
		}
	}
}
