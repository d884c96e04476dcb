package passwd

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// testRoot is a root with an /etc, and a writer of its files.
func testRoot(t *testing.T) (string, func(name, data string)) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root, func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(root, "etc", name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLookup(t *testing.T) {
	root, write := testRoot(t)
	write("passwd", "root:x:0:0:root:/root:/bin/sh\n# comment\nalice:x:1000:1000::/home/alice:/bin/sh\n")
	write("group", "root:x:0:\nalice:x:1000:\nwheel:x:10:alice,bob\ndocker:x:999:alice\n")
	for _, tc := range []struct {
		user            string
		uid, gid        uint32
		groups          []uint32
		notFound, isGrp bool
	}{
		{user: "", uid: 0, gid: 0, groups: []uint32{}},
		{user: "alice", uid: 1000, gid: 1000, groups: []uint32{10, 999}},
		{user: "1000", uid: 1000, gid: 1000, groups: []uint32{10, 999}},
		{user: "alice:wheel", uid: 1000, gid: 10, groups: []uint32{10, 999}},
		{user: "4242", uid: 4242, gid: 0, groups: []uint32{}}, // unknown uid: as given
		{user: "5:7", uid: 5, gid: 7, groups: []uint32{}},     // numeric pair: no lookup
		{user: "bob", notFound: true},
		{user: "alice:nogroup", notFound: true, isGrp: true},
	} {
		cred, err := Lookup(root, tc.user)
		var nf *NotFoundError
		if tc.notFound {
			if !errors.As(err, &nf) || (nf.What == "group") != tc.isGrp {
				t.Errorf("%q: err %v, want not found", tc.user, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.user, err)
			continue
		}
		if cred.Uid != tc.uid || cred.Gid != tc.gid || !slices.Equal(cred.Groups, tc.groups) {
			t.Errorf("%q: got %d:%d %v, want %d:%d %v", tc.user, cred.Uid, cred.Gid, cred.Groups, tc.uid, tc.gid, tc.groups)
		}
	}
}

// TestLookupSeesChangedFiles: the cache never serves credentials from a
// version of the files that is gone, even when the new one has the same
// size and is written within a second of the last lookup.
func TestLookupSeesChangedFiles(t *testing.T) {
	root, write := testRoot(t)
	lookup := func(user string) *syscall.Credential {
		t.Helper()
		cred, err := Lookup(root, user)
		if err != nil {
			t.Fatalf("%q: %v", user, err)
		}
		return cred
	}
	write("passwd", "alice:x:1000:1000::/home/alice:/bin/sh\n")
	write("group", "wheel:x:10:alice\n")
	time.Sleep(settle + 100*time.Millisecond) // settled: the next lookups cache
	for range 2 {
		if c := lookup("alice"); c.Uid != 1000 || c.Gid != 1000 || !slices.Equal(c.Groups, []uint32{10}) {
			t.Fatalf("alice: %+v", c)
		}
	}
	if _, ok := cache.get(root+"\x00alice", [2]stamp{stampOf(filepath.Join(root, "etc/passwd")), stampOf(filepath.Join(root, "etc/group"))}); !ok {
		t.Fatal("settled files: the lookup was not cached")
	}
	lookup("alice").Groups[0] = 99
	if c := lookup("alice"); !slices.Equal(c.Groups, []uint32{10}) {
		t.Fatalf("a caller's change to its groups reached the cache: %v", c.Groups)
	}
	// Same sizes, written at once: each change must show.
	write("passwd", "alice:x:1001:1000::/home/alice:/bin/sh\n")
	if c := lookup("alice"); c.Uid != 1001 || !slices.Equal(c.Groups, []uint32{10}) {
		t.Fatalf("after a passwd change: %+v", c)
	}
	write("group", "wheel:x:11:alice\n")
	if c := lookup("alice"); !slices.Equal(c.Groups, []uint32{11}) {
		t.Fatalf("after a group change: %+v", c)
	}
	if err := os.Remove(filepath.Join(root, "etc/passwd")); err != nil {
		t.Fatal(err)
	}
	if _, err := Lookup(root, "alice"); err == nil {
		t.Fatal("alice found after /etc/passwd was removed")
	}
}
