package xfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// BenchmarkCreateRemove is one sandbox's layer lifecycle: the node needs
// about 100 of these a second.
func BenchmarkCreateRemove(b *testing.B) {
	s, _ := testStore(b)
	ctx := context.Background()
	var create time.Duration
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprint("sb-", i)
		start := time.Now()
		if _, _, err := s.create(ctx, id, 1<<30, 65536); err != nil {
			b.Fatal(err)
		}
		create += time.Since(start)
		if err := s.Remove(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(create.Microseconds())/float64(b.N), "create-µs/op")
}

// BenchmarkRemoveManyFiles removes a layer of 10,000 files in 100 dirs.
func BenchmarkRemoveManyFiles(b *testing.B) {
	s, _ := testStore(b)
	ctx := context.Background()
	for i := range b.N {
		b.StopTimer()
		id := fmt.Sprint("sb-", i)
		up, _, err := s.create(ctx, id, 1<<30, 20000)
		if err != nil {
			b.Fatal(err)
		}
		for d := range 100 {
			dir := filepath.Join(up, fmt.Sprint(d))
			if err := os.Mkdir(dir, 0o755); err != nil {
				b.Fatal(err)
			}
			for f := range 100 {
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(f)), []byte("x"), 0o644); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.StartTimer()
		if err := s.Remove(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOpenFormat is a node's first Open: a 64 GiB sparse image,
// mkfs.xfs, loop attach and mount (Close with unmount is not timed).
func BenchmarkOpenFormat(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	ctx := context.Background()
	for range b.N {
		dir := b.TempDir()
		start := time.Now()
		s, err := Open(ctx, Config{Dir: dir})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		b.ReportMetric(float64(time.Since(start).Milliseconds()), "ms/open")
		if st, err := os.Stat(filepath.Join(dir, imageName)); err == nil {
			used := st.Sys().(*syscall.Stat_t).Blocks * 512
			b.ReportMetric(float64(used)/(1<<20), "MiB-allocated")
		}
		if err := s.Close(ctx, true); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
