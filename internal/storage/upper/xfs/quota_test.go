package xfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

const blk = 4096

func TestBlockLimit(t *testing.T) {
	s, _ := testStore(t)
	ctx := context.Background()
	const limit = 8 << 20
	upA, _, err := s.create(ctx, "a", limit, 1000)
	if err != nil {
		t.Fatal(err)
	}
	upB, _, err := s.create(ctx, "b", limit, 1000)
	if err != nil {
		t.Fatal(err)
	}
	n, err := fill(t, filepath.Join(upA, "yes"))
	if !isQuotaErr(err) {
		t.Fatalf("write stopped with %v after %d bytes, want ENOSPC or EDQUOT", err, n)
	}
	t.Logf("a: wrote %d bytes of a %d byte limit, then %v", n, limit, err)
	if n > limit || n < limit-16*blk {
		t.Errorf("a: wrote %d bytes, want within 16 blocks below the %d byte limit", n, limit)
	}
	used, _, err := s.Usage("a")
	if err != nil || used > limit || used < limit-16*blk {
		t.Errorf("Usage(a) = %d, %v; want about %d", used, err, limit)
	}
	// Another project still writes.
	if err := os.WriteFile(filepath.Join(upB, "f"), make([]byte, 4<<20), 0o644); err != nil {
		t.Errorf("b: write with a full: %v", err)
	}
}

func TestInodeLimit(t *testing.T) {
	s, _ := testStore(t)
	const limit = 200
	up, _, err := s.create(context.Background(), "a", 16<<20, limit)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for ; n < 10*limit; n++ {
		f, err := os.Create(filepath.Join(up, fmt.Sprint(n)))
		if err != nil {
			if !isQuotaErr(err) {
				t.Fatalf("create %d stopped with %v, want ENOSPC or EDQUOT", n, err)
			}
			break
		}
		f.Close()
	}
	t.Logf("created %d files with an inode limit of %d", n, limit)
	// The layout's inodes are added to the limit; without an overlay
	// mounted, work/work and work/index are not there yet.
	if n < limit || n > limit+layoutInodes {
		t.Errorf("created %d files, want about %d", n, limit)
	}
}

func TestOverlayChargesProject(t *testing.T) {
	s, _ := testStore(t)
	ctx := context.Background()
	lower := t.TempDir()
	const lowerSize = 1 << 20
	if err := os.WriteFile(filepath.Join(lower, "big"), make([]byte, lowerSize), 0o644); err != nil {
		t.Fatal(err)
	}
	const limit = 4 << 20
	up, work, err := s.create(ctx, "ov", limit, 100)
	if err != nil {
		t.Fatal(err)
	}
	root := mountOverlay(t, lower, up, work)
	before, _, _ := s.Usage("ov")
	// Copy-up: appending to a lower file copies it into upper.
	f, err := os.OpenFile(filepath.Join(root, "big"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write([]byte("x"))
	f.Close()
	if err != nil {
		t.Fatalf("copy-up: %v", err)
	}
	after, _, err := s.Usage("ov")
	if err != nil || after-before < lowerSize {
		t.Fatalf("Usage after copy-up = %d (before %d), %v; want %d more", after, before, err, lowerSize)
	}
	n, err := fill(t, filepath.Join(root, "new"))
	if !isQuotaErr(err) {
		t.Fatalf("overlay write stopped with %v, want ENOSPC or EDQUOT", err)
	}
	total := n + lowerSize
	if total > limit || total < limit-16*blk {
		t.Errorf("overlay: %d bytes in upper at the first error, want about %d", total, limit)
	}
	_, inodes, _ := s.Usage("ov")
	t.Logf("overlay: copy-up charged %d bytes; new file %d bytes; %d inodes charged beyond the layout", after-before, n, inodes)
}

func TestPersistAcrossReopen(t *testing.T) {
	s, e := testStore(t)
	ctx := context.Background()
	projids := map[uint32]string{}
	for _, id := range []string{"a", "b"} {
		up, _, err := s.create(ctx, id, 4<<20, 100)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(up, "data"), []byte(id), 0o644); err != nil {
			t.Fatal(err)
		}
		p, _ := s.projectOf(id)
		projids[p] = id
	}
	if err := s.Close(ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.create(ctx, "x", 4<<20, 100); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Create after Close: %v, want failed precondition", err)
	}

	s = e.open() // daemon restart: the mount is still there
	if ids, err := s.IDs(); err != nil || !slices.Equal(ids, []string{"a", "b"}) {
		t.Fatalf("IDs after reopen = %v, %v; want [a b]", ids, err)
	}
	if _, _, err := s.create(ctx, "c", 4<<20, 100); err != nil {
		t.Fatal(err)
	}
	p, _ := s.projectOf("c")
	if other, dup := projids[p]; dup || p == 0 {
		t.Errorf("c got project id %d, already %q's", p, other)
	}

	if err := s.Close(ctx, true); err != nil {
		t.Fatal(err)
	}
	s = e.open() // node reboot: mounts the image again
	if ids, err := s.IDs(); err != nil || !slices.Equal(ids, []string{"a", "b", "c"}) {
		t.Fatalf("IDs after remount = %v, %v; want [a b c]", ids, err)
	}
	b, err := os.ReadFile(filepath.Join(s.mnt, "a", "upper", "data"))
	if err != nil || string(b) != "a" {
		t.Errorf("a's data after remount = %q, %v", b, err)
	}
	if _, _, err := s.create(ctx, "d", 4<<20, 100); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.projectOf("d"); projids[p] != "" {
		t.Errorf("d got project id %d, already %q's", p, projids[p])
	}
	// The limits survived too.
	if _, err := fill(t, filepath.Join(s.mnt, "a", "upper", "more")); !isQuotaErr(err) {
		t.Errorf("a after remount: %v, want a quota error", err)
	}
}

func TestRemove(t *testing.T) {
	s, _ := testStore(t)
	ctx := context.Background()
	up, _, err := s.create(ctx, "a", 8<<20, 5000)
	if err != nil {
		t.Fatal(err)
	}
	for d := range 10 {
		sub := filepath.Join(up, fmt.Sprint("d", d), "nested")
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		for f := range 100 {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprint(f)), []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := fill(t, filepath.Join(up, "big")); !isQuotaErr(err) {
		t.Fatal(err)
	}
	p, _ := s.projectOf("a")
	if err := s.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// XFS frees unlinked inodes in the background; the charge drains soon.
	var b, i int64
	for start := time.Now(); time.Since(start) < 30*time.Second; time.Sleep(10 * time.Millisecond) {
		if b, i, err = usage(s.rootFd, p); err != nil || b == 0 && i == 0 {
			break
		}
	}
	if err != nil || b != 0 || i != 0 {
		t.Errorf("project %d after Remove: %d bytes, %d inodes, %v; want 0, 0", p, b, i, err)
	}
	if err := s.Remove(ctx, "a"); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if _, _, err := s.Usage("a"); !errdefs.IsNotFound(err) {
		t.Errorf("Usage after Remove: %v, want not found", err)
	}
	if ids, _ := s.IDs(); len(ids) != 0 {
		t.Errorf("IDs after Remove = %v", ids)
	}
	// The id is free again, with fresh accounting.
	if _, _, err := s.create(ctx, "a", 8<<20, 100); err != nil {
		t.Fatal(err)
	}
	if b, i, err := s.Usage("a"); err != nil || b != 0 || i != 0 {
		t.Errorf("Usage of recreated a = %d, %d, %v; want 0, 0", b, i, err)
	}
	if _, _, err := s.create(ctx, "a", 8<<20, 100); !errdefs.IsAlreadyExists(err) {
		t.Errorf("Create of an existing id: %v, want already exists", err)
	}
}

// TestInvalidArguments needs no filesystem: arguments are checked first.
func TestInvalidArguments(t *testing.T) {
	s := &Store{closed: true}
	ctx := context.Background()
	for _, c := range []struct {
		id            string
		bytes, inodes int64
		want          string
	}{
		{"", 8 << 20, 100, "sandbox id: must not be empty"},
		{"a/b", 8 << 20, 100, "must not contain '/'"},
		{"..", 8 << 20, 100, "must not start with '.'"},
		{".trash", 8 << 20, 100, "must not start with '.'"},
		{strings.Repeat("x", 256), 8 << 20, 100, "over the limit of 200"},
		{"ok", -1, 100, "disk: -1 bytes is below the minimum of 1048576"},
		{"ok", 1000, 100, "disk: 1000 bytes is below the minimum of 1048576"},
		{"ok", 8 << 20, -5, "disk inodes: -5 is below the minimum of 16"},
	} {
		_, _, err := s.create(ctx, c.id, c.bytes, c.inodes)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Create(%q, %d, %d) = %v; want invalid argument %q", c.id, c.bytes, c.inodes, err, c.want)
		}
	}
	for _, id := range []string{"", "../x", "."} {
		if err := s.Remove(ctx, id); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Remove(%q) = %v; want invalid argument", id, err)
		}
	}
	_, err := Open(ctx, Config{Dir: t.TempDir(), SizeBytes: 1 << 20})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "quota image size: 1048576 bytes is below the minimum") {
		t.Errorf("Open with a tiny image: %v", err)
	}
}

// A project that still has a charge (a deleted file held open) is not
// handed out again.
func TestChargedProjectNotReused(t *testing.T) {
	s, _ := testStore(t)
	ctx := context.Background()
	up, _, err := s.create(ctx, "a", 4<<20, 100)
	if err != nil {
		t.Fatal(err)
	}
	held, err := os.Create(filepath.Join(up, "held"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := held.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	p, _ := s.projectOf("a")
	if err := s.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// p is the lowest free id now, so the allocator looks at it first.
	if _, _, err := s.create(ctx, "b", 4<<20, 100); err != nil {
		t.Fatal(err)
	}
	if q, _ := s.projectOf("b"); q == p {
		t.Errorf("b got project %d, which a deleted but open file is still charged to", p)
	}
}
