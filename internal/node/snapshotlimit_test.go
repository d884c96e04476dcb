package node

import (
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

func limitNode(t *testing.T, l SnapshotLimits, kept ...int64) *Node {
	n := &Node{cfg: Config{DataDir: t.TempDir(), Snapshots: l}}
	n.snaps.byID = map[string]*SnapshotInfo{}
	for i, b := range kept {
		id := "snap-" + strings.Repeat("0", 15) + string(rune('a'+i))
		n.snaps.byID[id] = &SnapshotInfo{ID: id, Bytes: b}
	}
	return n
}

// TestSnapshotCountLimit: the count limit counts kept snapshots and those
// being written; the refusal names the limit and the use.
func TestSnapshotCountLimit(t *testing.T) {
	n := limitNode(t, SnapshotLimits{Count: 2, Bytes: -1}, 100)
	release, err := n.reserveSnapshot(256 * mib)
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.reserveSnapshot(256 * mib)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "at most 2 (--max-snapshots) and holds 2") {
		t.Errorf("third snapshot with one kept and one being written: %v, want resource exhausted naming 2 and 2", err)
	}
	release()
	release2, err := n.reserveSnapshot(256 * mib)
	if err != nil {
		t.Errorf("after the one being written went: %v", err)
	} else {
		release2()
	}
	if n.snaps.making != 0 || n.snaps.makingBytes != 0 {
		t.Errorf("reservations left: %d, %d bytes", n.snaps.making, n.snaps.makingBytes)
	}
}

// TestSnapshotBytesLimit: kept snapshots count at their size, one being
// written at its sandbox's memory size.
func TestSnapshotBytesLimit(t *testing.T) {
	n := limitNode(t, SnapshotLimits{Count: -1, Bytes: gib}, 512*mib)
	_, err := n.reserveSnapshot(768 * mib)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "at most 1GiB") || !strings.Contains(err.Error(), "use 512MiB") || !strings.Contains(err.Error(), "at least 768MiB") {
		t.Errorf("768 MiB over 512 of 1024 used: %v, want resource exhausted naming limit, use and need", err)
	}
	release, err := n.reserveSnapshot(256 * mib)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if _, err := n.reserveSnapshot(512 * mib); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "use 768MiB") {
		t.Errorf("a snapshot being written does not count: %v", err)
	}
}

// TestSnapshotLimitDefaults: no count given is DefaultMaxSnapshots; no
// bytes given is half the data dir's filesystem; negative is no limit.
func TestSnapshotLimitDefaults(t *testing.T) {
	dir := t.TempDir()
	l, err := SnapshotLimits{}.resolve(dir)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if l.Count != DefaultMaxSnapshots || l.Bytes != int64(st.Blocks)*st.Bsize/2 {
		t.Errorf("defaults: %+v", l)
	}
	kept := make([]int64, 100)
	n := limitNode(t, SnapshotLimits{Count: -1, Bytes: -1}, kept...)
	if _, err := n.reserveSnapshot(1 << 50); err != nil {
		t.Errorf("no limits: %v", err)
	}
}

// TestSnapshotLimitConcurrent: concurrent reservations never pass the
// count limit together.
func TestSnapshotLimitConcurrent(t *testing.T) {
	n := limitNode(t, SnapshotLimits{Count: 5, Bytes: -1})
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := n.reserveSnapshot(mib); err == nil {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if admitted != 5 {
		t.Errorf("%d admitted, want 5", admitted)
	}
}
