package node

import (
	"context"

	"github.com/corral-dev/corral/internal/state"
)

// AdmitFunc decides whether rec may be created given live, the records of
// every sandbox of the node that holds resources (creating, running or
// paused, in-flight creates included). The node is the source of truth:
// usage is derived from its records, so nothing leaks after a crash.
type AdmitFunc func(ctx context.Context, rec *state.Record, live func() []*state.Record) error

// reserve runs Config.Admit for rec under the admission lock and counts
// rec as in flight until unreserve, so concurrent creates cannot both take
// the last of a quota.
func (n *Node) reserve(ctx context.Context, rec *state.Record) error {
	if n.cfg.Admit == nil {
		return nil
	}
	n.admitMu.Lock()
	defer n.admitMu.Unlock()
	if err := n.cfg.Admit(ctx, rec, n.liveRecords); err != nil {
		return err
	}
	// A copy: Create goes on filling in rec.
	n.pending[rec] = *rec
	return nil
}

// unreserve ends rec's in-flight count: by now it is in n.sandboxes, or
// its create failed.
func (n *Node) unreserve(rec *state.Record) {
	if n.cfg.Admit == nil {
		return
	}
	n.admitMu.Lock()
	delete(n.pending, rec)
	n.admitMu.Unlock()
}

// LiveRecords returns the records of the sandboxes holding resources
// (creating, running, paused), in-flight creates included.
func (n *Node) LiveRecords() []*state.Record {
	n.admitMu.Lock()
	defer n.admitMu.Unlock()
	return n.liveRecords()
}

// liveRecords is LiveRecords for a caller holding admitMu.
func (n *Node) liveRecords() []*state.Record {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]*state.Record, 0, len(n.sandboxes)+len(n.pending))
	for _, e := range n.sandboxes {
		if rec := e.snapshot(); rec.Phase != state.PhaseStopped {
			rec.MemoryBytes = committedMemory(rec)
			out = append(out, rec)
		}
	}
	for _, rec := range n.pending {
		if _, done := n.sandboxes[rec.ID]; !done {
			out = append(out, &rec)
		}
	}
	return out
}
