package xfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/upper/loopdev"
	"golang.org/x/sys/unix"
)

const testImageSize = 512 << 20

// env is one test's store dir and every store opened on it.
type env struct {
	tb     testing.TB
	dir    string
	stores []*Store
}

// testStore opens a store on a fresh temp dir. Cleanup closes every store
// opened on it, the last with unmount, and then checks that no mount is left
// under the dir and that every loop device used is detached.
func testStore(tb testing.TB) (*Store, *env) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("quota tests need root (loop devices, mount, quotactl)")
	}
	e := &env{tb: tb, dir: tb.TempDir()}
	tb.Cleanup(e.cleanup)
	return e.open(), e
}

func (e *env) open() *Store {
	e.tb.Helper()
	s, err := Open(context.Background(), Config{Dir: e.dir, SizeBytes: testImageSize})
	if errdefs.IsNotSupported(err) {
		e.tb.Skipf("skip: %v", err)
	}
	if err != nil {
		e.tb.Fatalf("Open: %v", err)
	}
	e.stores = append(e.stores, s)
	return s
}

func (e *env) cleanup() {
	tb := e.tb
	ctx := context.Background()
	for i, s := range e.stores {
		if err := s.Close(ctx, i == len(e.stores)-1); err != nil {
			tb.Errorf("Close: %v", err)
		}
	}
	mnt := filepath.Join(e.dir, mountName)
	if m, _ := findMount(mnt); m != nil {
		tb.Errorf("leak: %s still mounted (%s)", mnt, m.Source)
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
	}
	for _, s := range e.stores {
		if back := loopdev.BackingFile(s.loopDev); back != "" {
			tb.Errorf("leak: %s still attached to %s", s.loopDev, back)
		}
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		tb.Fatal(err)
	}
	if strings.Contains(string(b), e.dir) {
		tb.Errorf("leak: a mount under %s is left:\n%s", e.dir, b)
	}
}

// fill appends to path in 64 KiB writes until a write fails; it returns the
// bytes written and the error.
func fill(tb testing.TB, path string) (int64, error) {
	tb.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := []byte(strings.Repeat("y\n", 32<<10))
	var n int64
	for {
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			return n, err
		}
		if n > 1<<30 {
			tb.Fatalf("wrote 1 GiB to %s without hitting a quota", path)
		}
	}
}

func isQuotaErr(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

// mountOverlay mounts an overlay of lower under upper/work at a temp dir and
// unmounts it in cleanup (registered after, so run before, the store's).
func mountOverlay(tb testing.TB, lower, upper, work string) string {
	tb.Helper()
	target := tb.TempDir()
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		tb.Fatalf("mount overlay: %v", err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount(target, 0); err != nil {
			tb.Errorf("unmount overlay: %v", err)
		}
	})
	return target
}
