package cluster

import (
	"context"
	"fmt"
	"sync"
)

// moves are the cluster's routing records of migrated sandboxes: a
// sandbox id names the node it was made on, and a record here says which
// node it is on instead. A record is written when a migration switches
// over and removed when the sandbox is deleted (or moves back to the node
// its id names).
type moves struct {
	mu sync.RWMutex
	to map[string]string
}

func (w *Watcher) resetMovesLocked() {
	w.moves.mu.Lock()
	w.moves.to = map[string]string{}
	w.moves.mu.Unlock()
}

func (w *Watcher) applyMoveLocked(id string, value []byte, deleted bool) {
	w.moves.mu.Lock()
	defer w.moves.mu.Unlock()
	if w.moves.to == nil {
		w.moves.to = map[string]string{}
	}
	if deleted {
		delete(w.moves.to, id)
	} else {
		w.moves.to[id] = string(value)
	}
}

// MovedTo is the node a migrated sandbox is on, if it moved.
func (w *Watcher) MovedTo(id string) (string, bool) {
	w.moves.mu.RLock()
	defer w.moves.mu.RUnlock()
	n, ok := w.moves.to[id]
	return n, ok
}

// Move routes sandbox id to node from now on, and waits until this
// watcher routes it so (the caller's next call goes there).
func (w *Watcher) Move(ctx context.Context, id, node string) error {
	home, err := nodeOf(id)
	if err != nil {
		return err
	}
	if node == home {
		_, err = w.cli.Delete(ctx, movesPrefix+id)
	} else {
		_, err = w.cli.Put(ctx, movesPrefix+id, node)
	}
	if err != nil {
		return fmt.Errorf("route sandbox %s to node %s: %w", id, node, err)
	}
	return w.WaitFor(ctx, func(*Snapshot) bool {
		to, ok := w.MovedTo(id)
		return (ok && to == node) || (!ok && node == home)
	})
}

// Unmove drops sandbox id's routing record (the sandbox was deleted).
func (w *Watcher) Unmove(ctx context.Context, id string) error {
	if _, ok := w.MovedTo(id); !ok {
		return nil
	}
	if _, err := w.cli.Delete(ctx, movesPrefix+id); err != nil {
		return fmt.Errorf("drop the route of sandbox %s: %w", id, err)
	}
	return nil
}
