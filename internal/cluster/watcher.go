package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// NodeState is a node's state as control instances see it.
type NodeState string

const (
	NodeReady   NodeState = "ready"
	NodeDrained NodeState = "drained"
	NodeLost    NodeState = "lost"
)

// NodeView is one node in a watcher snapshot.
type NodeView struct {
	NodeRecord
	// Member is set for every node that ever registered.
	Member MemberRecord
	State  NodeState
	// Reason says why a node is lost.
	Reason string
	// burst caches Labels[PoolLabel] == BurstPool.
	burst bool
}

// Snapshot is an immutable view of the cluster's nodes, sorted by id.
type Snapshot struct {
	Nodes []*NodeView
	byID  map[string]*NodeView
}

// Node returns the node with id, or nil.
func (s *Snapshot) Node(id string) *NodeView { return s.byID[id] }

// Watcher follows the cluster's node, member and drain records in etcd.
// It keeps no state of its own: a restarted control instance rebuilds the
// same view from what the nodes wrote.
type Watcher struct {
	cli *clientv3.Client
	log *slog.Logger

	mu      sync.Mutex
	nodes   map[string]NodeRecord
	members map[string]MemberRecord
	drained map[string]bool
	goneAt  map[string]time.Time // when this instance saw a node's record go
	moves   moves                // migrated sandboxes' nodes (moves.go)
	// views are the nodes of the last snapshot, by id, in order; dirty
	// the ids whose records changed since. A report changes one node:
	// the next snapshot shares every other node's view.
	views map[string]*NodeView
	order []string
	dirty map[string]bool

	snap    atomic.Pointer[Snapshot]
	changed chan struct{} // closed and replaced on every change
	stop    context.CancelFunc
	done    chan struct{}
}

// StartWatcher loads the cluster's records and follows them until Close.
func StartWatcher(ctx context.Context, cli *clientv3.Client, log *slog.Logger) (*Watcher, error) {
	if log == nil {
		log = slog.Default()
	}
	w := &Watcher{cli: cli, log: log, changed: make(chan struct{}), done: make(chan struct{})}
	rev, err := w.load(ctx)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w.stop = cancel
	go w.run(wctx, rev)
	return w, nil
}

func (w *Watcher) load(ctx context.Context) (int64, error) {
	resp, err := w.cli.Get(ctx, clusterPrefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("cluster watcher: load nodes: %w", err)
	}
	w.mu.Lock()
	w.nodes, w.members, w.drained = map[string]NodeRecord{}, map[string]MemberRecord{}, map[string]bool{}
	w.resetMovesLocked()
	if w.goneAt == nil {
		w.goneAt = map[string]time.Time{}
	}
	// Every node is rebuilt (one that is gone from etcd too).
	w.dirty = map[string]bool{}
	for id := range w.views {
		w.dirty[id] = true
	}
	for _, kv := range resp.Kvs {
		w.applyLocked(string(kv.Key), kv.Value, false)
	}
	w.publishLocked()
	w.mu.Unlock()
	return resp.Header.Revision, nil
}

// applyLocked applies one put (or delete) of key.
func (w *Watcher) applyLocked(key string, value []byte, deleted bool) {
	switch {
	case strings.HasPrefix(key, nodesPrefix):
		id := idFromKey(nodesPrefix, key)
		w.dirty[id] = true
		var rec NodeRecord
		if deleted || json.Unmarshal(value, &rec) != nil {
			if _, ok := w.nodes[id]; ok {
				w.goneAt[id] = time.Now()
			}
			delete(w.nodes, id)
			return
		}
		delete(w.goneAt, id)
		w.nodes[id] = rec
	case strings.HasPrefix(key, membersPrefix):
		id := idFromKey(membersPrefix, key)
		w.dirty[id] = true
		var m MemberRecord
		if deleted || json.Unmarshal(value, &m) != nil {
			delete(w.members, id)
			return
		}
		w.members[id] = m
	case strings.HasPrefix(key, movesPrefix):
		w.applyMoveLocked(idFromKey(movesPrefix, key), value, deleted)
	case strings.HasPrefix(key, drainPrefix):
		id := idFromKey(drainPrefix, key)
		w.dirty[id] = true
		if deleted {
			delete(w.drained, id)
		} else {
			w.drained[id] = true
		}
	}
}

func (w *Watcher) publishLocked() {
	if w.views == nil {
		w.views = map[string]*NodeView{}
	}
	reorder := false
	for id := range w.dirty {
		v := w.viewLocked(id)
		_, had := w.views[id]
		if v == nil {
			delete(w.views, id)
		} else {
			w.views[id] = v
		}
		reorder = reorder || had != (v != nil)
	}
	clear(w.dirty)
	if reorder {
		w.order = w.order[:0]
		for id := range w.views {
			w.order = append(w.order, id)
		}
		sort.Strings(w.order)
	}
	s := &Snapshot{Nodes: make([]*NodeView, len(w.order)), byID: make(map[string]*NodeView, len(w.order))}
	for i, id := range w.order {
		s.Nodes[i] = w.views[id]
		s.byID[id] = s.Nodes[i]
	}
	w.snap.Store(s)
	close(w.changed)
	w.changed = make(chan struct{})
}

// viewLocked is node id as its records say now (nil when it has none).
func (w *Watcher) viewLocked(id string) *NodeView {
	if rec, ok := w.nodes[id]; ok {
		v := &NodeView{NodeRecord: rec, Member: w.members[id], State: NodeReady, burst: rec.Labels[PoolLabel] == BurstPool}
		if w.drained[id] {
			v.State = NodeDrained
		}
		return v
	}
	m, ok := w.members[id]
	if !ok {
		return nil
	}
	reason := fmt.Sprintf("node %s (%s) has no live lease: it stopped renewing its registration (registered %s)",
		id, m.Address, m.RegisteredAt.Format(time.RFC3339))
	if t, ok := w.goneAt[id]; ok {
		reason = fmt.Sprintf("node %s (%s) lost its lease at %s", id, m.Address, t.UTC().Format(time.RFC3339))
	}
	return &NodeView{NodeRecord: NodeRecord{ID: id, Address: m.Address}, Member: m, State: NodeLost, Reason: reason}
}

func (w *Watcher) run(ctx context.Context, rev int64) {
	defer close(w.done)
	for ctx.Err() == nil {
		wch := w.cli.Watch(clientv3.WithRequireLeader(ctx), clusterPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for resp := range wch {
			if err := resp.Err(); err != nil {
				w.log.Warn("cluster watch", "err", err)
				break
			}
			w.mu.Lock()
			for _, ev := range resp.Events {
				w.applyLocked(string(ev.Kv.Key), ev.Kv.Value, ev.Type == clientv3.EventTypeDelete)
			}
			w.publishLocked()
			w.mu.Unlock()
			rev = resp.Header.Revision
		}
		if ctx.Err() != nil {
			return
		}
		// The watch broke (compaction, leader loss): reload, then go on.
		time.Sleep(200 * time.Millisecond)
		r, err := w.load(ctx)
		if err != nil {
			w.log.Warn("cluster watcher reload", "err", err)
			continue
		}
		rev = r
	}
}

// Snapshot returns the current view.
func (w *Watcher) Snapshot() *Snapshot { return w.snap.Load() }

// WaitFor blocks until cond holds for a snapshot or ctx ends.
func (w *Watcher) WaitFor(ctx context.Context, cond func(*Snapshot) bool) error {
	for {
		w.mu.Lock()
		ch := w.changed
		w.mu.Unlock()
		if cond(w.Snapshot()) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Drain marks (or unmarks) node id drained.
func (w *Watcher) Drain(ctx context.Context, id string, drained bool) error {
	var err error
	if drained {
		_, err = w.cli.Put(ctx, drainPrefix+id, time.Now().UTC().Format(time.RFC3339))
	} else {
		_, err = w.cli.Delete(ctx, drainPrefix+id)
	}
	if err != nil {
		return fmt.Errorf("drain node %s: %w", id, err)
	}
	return nil
}

// Close stops following.
func (w *Watcher) Close() {
	w.stop()
	<-w.done
}
