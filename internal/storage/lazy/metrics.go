package lazy

import (
	"fmt"
	"io"
	"sort"
	"strconv"
)

// WriteMetrics writes the FS's figures in the Prometheus text exposition
// format (version 0.0.4), per blob and per group: what a node's metrics
// endpoint serves (the server answers GET /v1/metrics with it).
func (f *FS) WriteMetrics(w io.Writer) error {
	stats := f.AllStats()
	sort.Slice(stats, func(i, j int) bool { return stats[i].Digest < stats[j].Digest })
	type metric struct {
		name, help, kind string
		value            func(Stats) int64
	}
	blobMetrics := []metric{
		{"corral_lazyblob_bytes_fetched_total", "Bytes fetched from the blob store.", "counter", func(s Stats) int64 { return s.BytesFetched }},
		{"corral_lazyblob_bytes_prefetched_total", "Bytes fetched by prefetch.", "counter", func(s Stats) int64 { return s.BytesPrefetch }},
		{"corral_lazyblob_chunk_hits_total", "Chunk reads served from the cache.", "counter", func(s Stats) int64 { return s.Hits }},
		{"corral_lazyblob_chunk_misses_total", "Chunk reads that waited for a fetch.", "counter", func(s Stats) int64 { return s.Misses }},
		{"corral_lazyblob_corrupt_chunks_total", "Fetched chunks that failed their digest.", "counter", func(s Stats) int64 { return s.CorruptChunks }},
		{"corral_lazyblob_failed_fetches_total", "Fetches that ended in EIO.", "counter", func(s Stats) int64 { return s.FailedFetches }},
		{"corral_lazyblob_chunks_present", "Chunks in the cache.", "gauge", func(s Stats) int64 { return int64(s.ChunksPresent) }},
		{"corral_lazyblob_chunks", "Chunks of the blob.", "gauge", func(s Stats) int64 { return int64(s.ChunksTotal) }},
		{"corral_lazyblob_degraded", "1 while the last fetch of the blob failed.", "gauge", func(s Stats) int64 {
			if s.Fault != nil {
				return 1
			}
			return 0
		}},
	}
	ew := &errWriter{w: w}
	for _, m := range blobMetrics {
		ew.printf("# HELP %s %s\n# TYPE %s %s\n", m.name, m.help, m.name, m.kind)
		for _, s := range stats {
			ew.printf("%s{blob=%s} %d\n", m.name, strconv.Quote(s.Digest), m.value(s))
		}
	}
	ew.printf("# HELP corral_lazyblob_cache_bytes Bytes of chunks in the cache, all blobs.\n# TYPE corral_lazyblob_cache_bytes gauge\ncorral_lazyblob_cache_bytes %d\n", f.CacheBytes())

	f.groups.mu.Lock()
	names := make([]string, 0, len(f.groups.counters))
	for g := range f.groups.counters {
		names = append(names, g)
	}
	f.groups.mu.Unlock()
	sort.Strings(names)
	groupMetrics := []struct {
		name, help string
		value      func(GroupStats) int64
	}{
		{"corral_lazyblob_group_bytes_read_total", "Bytes a group (sandbox) read through lazy blob files.", func(g GroupStats) int64 { return g.BytesRead }},
		{"corral_lazyblob_group_bytes_fetched_total", "Bytes fetched for a group's reads.", func(g GroupStats) int64 { return g.BytesFetched }},
		{"corral_lazyblob_group_chunk_hits_total", "A group's chunk reads served from the cache.", func(g GroupStats) int64 { return g.Hits }},
		{"corral_lazyblob_group_chunk_misses_total", "A group's chunk reads that waited for a fetch.", func(g GroupStats) int64 { return g.Misses }},
	}
	for _, m := range groupMetrics {
		ew.printf("# HELP %s %s\n# TYPE %s counter\n", m.name, m.help, m.name)
		for _, g := range names {
			ew.printf("%s{group=%s} %d\n", m.name, strconv.Quote(g), m.value(f.GroupStats(g)))
		}
	}
	return ew.err
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}
