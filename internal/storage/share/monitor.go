package share

import (
	"context"
	image "github.com/corral-dev/corral/internal/storage/layers"
	lazyblob "github.com/corral-dev/corral/internal/storage/lazy"
	"time"
)

// FaultSink is told which layers cannot be read (the node marks their
// sandboxes degraded).
type FaultSink interface {
	// SetLayerFault records why layer digest cannot be read; "" clears it.
	SetLayerFault(digest, reason string)
}

// monitorInterval is how often the lazy blob server's faults are polled.
const monitorInterval = time.Second

// Monitor reports to sink, per layer, why lazily read layer data cannot
// be read: fetch faults (cleared once a fetch of that blob succeeds
// again), and the lazy blob server itself gone (every lazily read layer:
// its mounts are dead until the sandboxes are recreated), until ctx ends.
// layers lists the node's layers.
func (s *Share) Monitor(ctx context.Context, layers func(context.Context) ([]image.Layer, error), sink FaultSink) {
	m := &monitor{s: s, layers: layers, sink: sink, marked: map[string][]string{}}
	t := time.NewTicker(monitorInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := m.tick(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("lazy blob monitor", "err", err)
		}
	}
}

type monitor struct {
	s      *Share
	layers func(context.Context) ([]image.Layer, error)
	sink   FaultSink
	pid    int                 // the lazy blob server's, whose fault numbers seq follows
	seq    uint64              // the last fault seen
	marked map[string][]string // blob digest -> layer digests marked faulty
}

func (m *monitor) tick(ctx context.Context) error {
	pid, err := m.s.lazy.Pid(ctx)
	if err != nil {
		ls, lerr := m.layers(ctx)
		if lerr != nil {
			return lerr
		}
		for _, l := range ls {
			if m.s.LazilyRead(ctx, l) {
				if err := m.mark(ctx, l.BlobDigest, "lazy blob server unreachable: "+err.Error()); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if pid != m.pid { // a new server numbers its faults from 1
		m.pid, m.seq = pid, 0
	}
	evs, err := m.s.lazy.Faults(ctx, m.seq)
	if err != nil {
		return err
	}
	for _, ev := range evs {
		m.seq = max(m.seq, ev.Seq)
		if err := m.mark(ctx, ev.Digest, ev.Reason); err != nil {
			return err
		}
	}
	for b, lds := range m.marked {
		if st, err := m.s.lazy.Stats(ctx, b); err == nil && st.Fault == nil {
			for _, d := range lds {
				m.sink.SetLayerFault(d, "")
			}
			delete(m.marked, b)
			m.s.log.Info("layer data readable again", "blob", b)
		}
	}
	return nil
}

// mark reports every layer with blob digest b as unreadable.
func (m *monitor) mark(ctx context.Context, b, reason string) error {
	ls, err := m.layers(ctx)
	if err != nil {
		return err
	}
	if _, known := m.marked[b]; !known {
		m.s.log.Warn("layer data unreadable: its sandboxes are degraded", "blob", b, "reason", reason)
	}
	m.marked[b] = nil
	for _, l := range ls {
		if l.BlobDigest == b {
			m.sink.SetLayerFault(l.Digest, reason)
			m.marked[b] = append(m.marked[b], l.Digest)
		}
	}
	return nil
}

// SandboxReads returns the lazy reads of sandbox id, whose processes are
// in cgroup <parent>/<id> (or the best-effort parent's).
func (s *Share) SandboxReads(ctx context.Context, cgroupParent, idleParent, id string) (lazyblob.GroupStats, error) {
	var sum lazyblob.GroupStats
	for _, p := range []string{cgroupParent, idleParent} {
		g, err := s.lazy.GroupStats(ctx, "/"+p+"/"+id)
		if err != nil {
			return sum, err
		}
		sum.BytesRead += g.BytesRead
		sum.BytesFetched += g.BytesFetched
		sum.Hits += g.Hits
		sum.Misses += g.Misses
	}
	if t := sum.Hits + sum.Misses; t > 0 {
		sum.HitRate = float64(sum.Hits) / float64(t)
	}
	return sum, nil
}

// ForgetSandbox drops the read figures of sandbox id (it is deleted).
func (s *Share) ForgetSandbox(ctx context.Context, cgroupParent, idleParent, id string) error {
	for _, p := range []string{cgroupParent, idleParent} {
		if err := s.lazy.ForgetGroup(ctx, "/"+p+"/"+id); err != nil {
			return err
		}
	}
	return nil
}
