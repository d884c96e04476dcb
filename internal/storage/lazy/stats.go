package lazy

// Stats are one blob's figures since the FS started (chunk presence is
// the cache's, which survives restarts).
type Stats struct {
	Digest         string  `json:"digest"`
	Size           int64   `json:"size"`
	ChunkSize      int64   `json:"chunk_size"`
	ChunksTotal    int     `json:"chunks_total"`
	ChunksPresent  int     `json:"chunks_present"`
	BytesPresent   int64   `json:"bytes_present"`
	BytesFetched   int64   `json:"bytes_fetched"`    // from the store, prefetch included
	BytesPrefetch  int64   `json:"bytes_prefetched"` // of which by prefetch
	Hits           int64   `json:"hits"`             // chunk reads served from the cache
	Misses         int64   `json:"misses"`           // chunk reads that waited for a fetch
	HitRate        float64 `json:"hit_rate"`         // hits / (hits + misses); 0 with no reads
	CorruptChunks  int64   `json:"corrupt_chunks"`   // fetched chunks that failed their digest
	FailedFetches  int64   `json:"failed_fetches"`   // fetches that ended in EIO
	Fault          *Fault  `json:"fault,omitempty"`  // the last failed fetch, until one succeeds
	FetchedPercent float64 `json:"fetched_percent"`  // BytesFetched / Size × 100
}

// Stats returns blob digest's figures (errdefs.NotFound unless registered).
func (f *FS) Stats(digest string) (Stats, error) {
	b, err := f.blob(digest)
	if err != nil {
		return Stats{}, err
	}
	return b.stats(), nil
}

// AllStats returns the figures of every registered blob.
func (f *FS) AllStats() []Stats {
	var out []Stats
	for _, b := range f.all() {
		out = append(out, b.stats())
	}
	return out
}

// CacheBytes is the bytes of chunks the cache holds over all blobs.
func (f *FS) CacheBytes() int64 { return f.used.Load() }

func (b *blobFile) stats() Stats {
	s := Stats{
		Digest: b.digest, Size: b.m.Size, ChunkSize: b.m.ChunkSize, ChunksTotal: b.m.NumChunks(),
		BytesFetched: b.fetchedBytes.Load(), BytesPrefetch: b.prefetched.Load(),
		Hits: b.hits.Load(), Misses: b.misses.Load(),
		CorruptChunks: b.corrupt.Load(), FailedFetches: b.faults.Load(), Fault: b.fault.Load(),
	}
	b.mu.RLock()
	for i := range s.ChunksTotal {
		if b.has(i) {
			s.ChunksPresent++
			_, n := b.m.ChunkRange(i)
			s.BytesPresent += n
		}
	}
	b.mu.RUnlock()
	if t := s.Hits + s.Misses; t > 0 {
		s.HitRate = float64(s.Hits) / float64(t)
	}
	if s.Size > 0 {
		s.FetchedPercent = 100 * float64(s.BytesFetched) / float64(s.Size)
	}
	return s
}
