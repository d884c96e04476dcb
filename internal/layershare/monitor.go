package layershare

import (
	"context"
	"time"

	"github.com/corral-dev/corral/internal/image"
	"github.com/corral-dev/corral/internal/lazyblob"
)

// FaultSink is told which layers cannot be read (the node marks their
// sandboxes degraded).
type FaultSink interface {
	// SetLayerFault records why layer digest cannot be read; "" clears it.
	SetLayerFault(digest, reason string)
}

// monitorInterval is how often the lazy blob server's faults are polled.
const monitorInterval = time.Second

// Monitor reports fetch faults of lazily read blobs to sink, per layer
// using the blob, and clears them once a fetch of that blob succeeds
// again, until ctx ends. layers lists the node's layers.
func (s *Share) Monitor(ctx context.Context, layers func(context.Context) ([]image.Layer, error), sink FaultSink) {
	var seq uint64
	faulty := map[string][]string{} // blob digest -> layer digests marked
	t := time.NewTicker(monitorInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		evs, err := s.lazy.Faults(ctx, seq)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("lazy blob faults", "err", err)
			}
			continue
		}
		if len(evs) > 0 {
			ls, err := layers(ctx)
			if err != nil {
				s.log.Warn("lazy blob faults: layers", "err", err)
				continue
			}
			for _, ev := range evs {
				seq = max(seq, ev.Seq)
				if _, known := faulty[ev.Digest]; !known {
					s.log.Warn("layer data unreadable: its sandboxes are degraded", "blob", ev.Digest, "reason", ev.Reason)
				}
				faulty[ev.Digest] = nil
				for _, l := range ls {
					if l.BlobDigest == ev.Digest {
						sink.SetLayerFault(l.Digest, ev.Reason)
						faulty[ev.Digest] = append(faulty[ev.Digest], l.Digest)
					}
				}
			}
		}
		for b, lds := range faulty {
			if st, err := s.lazy.Stats(ctx, b); err == nil && st.Fault == nil {
				for _, d := range lds {
					sink.SetLayerFault(d, "")
				}
				delete(faulty, b)
				s.log.Info("layer data readable again", "blob", b)
			}
		}
	}
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
