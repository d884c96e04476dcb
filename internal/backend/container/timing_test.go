package container

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

func p50(d []time.Duration) string {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return fmt.Sprintf("p50 %v p90 %v", d[len(d)/2], d[len(d)*9/10])
}

// TestTimings logs create→ready, exec `true` and stop+cleanup latencies and
// the idle memory of init. It measures; it asserts nothing about time.
func TestTimings(t *testing.T) {
	if testing.Short() {
		t.Skip("timings")
	}
	t.Run("dir", func(t *testing.T) { timings(t, newBackend(t), nil) })
	// The disk of a default sandbox: 1 GiB, one inode per 16 KiB.
	t.Run("ext4-image", func(t *testing.T) { timings(t, newDiskBackend(t), withDisk(1<<30, 65536)) })
}

func timings(t *testing.T, b *Backend, mod func(*backend.Spec)) {
	if os.Getenv("CORRAL_TEST_DEBUG") != "" {
		b.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ctx := context.Background()
	const n = 20
	var create, execs, cleanup []time.Duration
	var boxes []backend.Sandbox
	for i := 0; i < n; i++ {
		start := time.Now()
		spec := defaultSpec(newID(t))
		if mod != nil {
			mod(&spec)
		}
		s, err := b.Create(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		create = append(create, time.Since(start))
		boxes = append(boxes, s)
	}
	for i := 0; i < 5*n; i++ {
		start := time.Now()
		run1(t, boxes[i%n], backend.ExecSpec{Argv: []string{"true"}})
		execs = append(execs, time.Since(start))
	}
	time.Sleep(500 * time.Millisecond) // let the inits go idle before sampling memory
	var rss, pss, priv, cg []int64
	for _, s := range boxes {
		r, p, pr := smapsRollup(t, s.(*sandbox).proc.Pid)
		rss, pss, priv = append(rss, r), append(pss, p), append(priv, pr)
		if u, err := os.ReadFile(filepath.Join(b.cg.Hierarchies().V1["memory"], cgParent, s.ID(), "memory.usage_in_bytes")); err == nil {
			var v int64
			fmt.Sscan(string(u), &v)
			cg = append(cg, v>>10)
		}
	}
	for _, s := range boxes {
		start := time.Now()
		if err := b.Cleanup(ctx, s.ID(), s.Record()); err != nil {
			t.Fatal(err)
		}
		cleanup = append(cleanup, time.Since(start))
	}
	t.Logf("create→ready: %s", p50(create))
	t.Logf("exec true:    %s", p50(execs))
	t.Logf("stop+cleanup: %s", p50(cleanup))
	t.Logf("idle init KiB: rss %v pss %v private %v; memory cgroup usage KiB %v", med(rss), med(pss), med(priv), med(cg))
}

func med(v []int64) int64 {
	if len(v) == 0 {
		return -1
	}
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	return v[len(v)/2]
}

func smapsRollup(t *testing.T, pid int) (rss, pss, private int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		var v int64
		fmt.Sscan(f[1], &v)
		switch f[0] {
		case "Rss:":
			rss = v
		case "Pss:":
			pss = v
		case "Private_Clean:", "Private_Dirty:":
			private += v
		}
	}
	return
}

func BenchmarkCreateExecCleanup(b *testing.B) {
	be := newBackend(b)
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		s, err := be.Create(ctx, defaultSpec(newID(b)))
		if err != nil {
			b.Fatal(err)
		}
		run1(b, s, backend.ExecSpec{Argv: []string{"true"}})
		if err := be.Cleanup(ctx, s.ID(), s.Record()); err != nil {
			b.Fatal(err)
		}
	}
}
