package e2e

import (
	"strconv"
	"strings"
	"testing"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// cgroupCache reads the page cache charged to a sandbox's memory cgroup
// (v1 total_cache, v2 file).
func cgroupCache(t *testing.T, parent, id string) int64 {
	t.Helper()
	stat, v1 := memoryCgroupFile(t, parent, id, "memory.stat", "memory.stat")
	key := "file"
	if v1 {
		key = "total_cache"
	}
	for line := range strings.Lines(stat) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+" "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("memory.stat: %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("memory.stat of %s has no %s", id, key)
	return 0
}

// TestImagePageCacheChargedToNode: the node reads a layer into the page
// cache when it mounts it, so the first sandbox to run the image's
// binaries is not charged for them (and its memory limit cannot evict
// them from under the other sandboxes of the image). With the warm turned
// off, the same reads are charged to that sandbox: the test can tell.
func TestImagePageCacheChargedToNode(t *testing.T) {
	for _, tc := range []struct {
		name    string
		warm    int64
		charged bool
	}{
		{"warm", 0, false},
		{"no warm", -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testenv.StartServer(t, func(c *server.Config) { c.LayerWarmBytes = tc.warm })
			sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
			out := testenv.Sh(t, sb, "wc -c < /bin/busybox; ls -R /etc > /dev/null")
			size, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
			if err != nil || size < 512<<10 {
				t.Fatalf("wc -c < /bin/busybox: %q (want a size of at least 512 KiB): %v", out, err)
			}
			cache := cgroupCache(t, srv.Config.CgroupParent, sb.ID())
			t.Logf("busybox %d bytes; page cache charged to the sandbox %d bytes", size, cache)
			if tc.charged && cache < size/2 {
				t.Errorf("without the warm, the first sandbox was charged %d bytes of page cache after reading the %d-byte busybox: want at least half of it", cache, size)
			}
			if !tc.charged && cache > size/4 {
				t.Errorf("the sandbox was charged %d bytes of page cache after reading the %d-byte busybox, which the node had read into the cache: want under a quarter of it", cache, size)
			}
		})
	}
}
