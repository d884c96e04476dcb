package fncall

// PoolSize is one pool's sandboxes, for metrics.
type PoolSize struct {
	Image       string
	MemoryBytes int64
	Idle, Total int
}

// PoolSizes reports every pool's size now.
func (s *Service) PoolSizes() []PoolSize {
	s.mu.Lock()
	pools := make([]*pool, 0, len(s.pools))
	for _, p := range s.pools {
		pools = append(pools, p)
	}
	s.mu.Unlock()
	out := make([]PoolSize, 0, len(pools))
	for _, p := range pools {
		p.mu.Lock()
		out = append(out, PoolSize{Image: p.key.image, MemoryBytes: p.key.memory, Idle: len(p.idle), Total: p.total})
		p.mu.Unlock()
	}
	return out
}
