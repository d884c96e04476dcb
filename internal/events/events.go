// Package events owns the node's lifecycle event log: a sequence-numbered,
// bounded log kept in memory and appended to files under the data dir, so a
// watcher resumes from a sequence number without gaps or duplicates, also
// across a daemon restart. It imports only the standard library; the node
// writes to it and the API layer reads from it.
package events

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Event types.
const (
	Created         = "created"
	Started         = "started"
	Paused          = "paused"
	Resumed         = "resumed"
	Checkpointed    = "checkpointed"
	OOMKilled       = "oom_killed"
	ExecTimedOut    = "exec_timed_out"
	IdleStopped     = "idle_stopped"
	LifetimeReached = "lifetime_reached"
	Stopped         = "stopped"
	Degraded        = "degraded"
	NetworkRefused  = "network_refused"
	Deleted         = "deleted"
)

// Types lists every event type, for validating filters.
var Types = []string{Created, Started, Paused, Resumed, Checkpointed, OOMKilled, ExecTimedOut,
	IdleStopped, LifetimeReached, Stopped, Degraded, NetworkRefused, Deleted}

// Event is one lifecycle event of a sandbox.
type Event struct {
	Seq       uint64             `json:"seq"`
	Time      time.Time          `json:"time"`
	Type      string             `json:"type"`
	SandboxID string             `json:"sandbox_id"`
	NodeID    string             `json:"node_id,omitempty"`
	Project   string             `json:"project,omitempty"`
	Backend   string             `json:"backend,omitempty"`
	Labels    map[string]string  `json:"labels,omitempty"`
	Reason    string             `json:"reason,omitempty"`
	Figures   map[string]float64 `json:"figures,omitempty"`
}

// Filter selects events; zero fields match everything.
type Filter struct {
	Project    string
	Labels     map[string]string
	SandboxIDs []string
	Types      []string
}

// Match reports whether e passes f.
func (f Filter) Match(e *Event) bool {
	if f.Project != "" && e.Project != f.Project {
		return false
	}
	if len(f.SandboxIDs) > 0 && !slices.Contains(f.SandboxIDs, e.SandboxID) {
		return false
	}
	if len(f.Types) > 0 && !slices.Contains(f.Types, e.Type) {
		return false
	}
	for k, v := range f.Labels {
		if e.Labels[k] != v {
			return false
		}
	}
	return true
}

// SegmentEvents is how many events one log file holds before the log
// rotates; two files are kept, so between SegmentEvents and twice that
// many events survive.
const SegmentEvents = 5000

const (
	currentName  = "events.jsonl"
	previousName = "events.1.jsonl"
)

// Log is the event log of one node. Its methods are safe for concurrent use.
type Log struct {
	dir string
	log *slog.Logger

	mu      sync.Mutex
	prev    []*Event // the rotated segment, oldest first
	cur     []*Event // the segment being written
	file    *os.File
	next    uint64        // the next sequence number
	changed chan struct{} // closed and replaced on every append
	closed  bool

	ending  chan struct{} // closed by EndWatches
	endOnce sync.Once
}

// Open loads the log kept in dir (made if missing) and continues its
// sequence numbers.
func Open(dir string, log *slog.Logger) (*Log, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("event log: %w", err)
	}
	l := &Log{dir: dir, log: log, next: 1, changed: make(chan struct{}), ending: make(chan struct{})}
	var err error
	if l.prev, err = readSegment(filepath.Join(dir, previousName)); err != nil {
		return nil, err
	}
	if l.cur, err = readSegment(filepath.Join(dir, currentName)); err != nil {
		return nil, err
	}
	if last := l.last(); last != nil {
		l.next = last.Seq + 1
	}
	l.file, err = os.OpenFile(filepath.Join(dir, currentName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("event log: %w", err)
	}
	return l, nil
}

// readSegment reads one log file; a torn last line (a crash mid-write) is
// dropped, as are lines out of sequence.
func readSegment(path string) ([]*Event, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("event log: %w", err)
	}
	defer f.Close()
	var out []*Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e Event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Seq == 0 {
			continue
		}
		if n := len(out); n > 0 && e.Seq <= out[n-1].Seq {
			continue
		}
		out = append(out, &e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("event log %s: %w", path, err)
	}
	return out, nil
}

func (l *Log) last() *Event {
	if n := len(l.cur); n > 0 {
		return l.cur[n-1]
	}
	if n := len(l.prev); n > 0 {
		return l.prev[n-1]
	}
	return nil
}

// Append numbers e, writes it to the log and wakes every watcher. A write
// failure is logged: the event still reaches live watchers.
func (l *Log) Append(e Event) Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return e
	}
	e.Seq = l.next
	l.next++
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if len(l.cur) >= SegmentEvents {
		l.rotateLocked()
	}
	l.cur = append(l.cur, &e)
	if b, err := json.Marshal(&e); err == nil {
		if _, err := l.file.Write(append(b, '\n')); err != nil {
			l.log.Warn("write event log", "err", err)
		}
	}
	close(l.changed)
	l.changed = make(chan struct{})
	return e
}

// rotateLocked makes the current segment the previous one and starts a new
// file; the old previous segment is dropped.
func (l *Log) rotateLocked() {
	cur, prev := filepath.Join(l.dir, currentName), filepath.Join(l.dir, previousName)
	l.file.Close()
	if err := os.Rename(cur, prev); err != nil {
		l.log.Warn("rotate event log", "err", err)
	}
	f, err := os.OpenFile(cur, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		l.log.Warn("rotate event log", "err", err)
		f, _ = os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	}
	l.file = f
	l.prev, l.cur = l.cur, nil
}

// LastSeq is the sequence number of the newest event (0: none yet).
func (l *Log) LastSeq() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next - 1
}

// after returns the kept events with a sequence number above seq, and the
// channel closed on the next append.
func (l *Log) after(seq uint64) ([]*Event, <-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*Event
	for _, seg := range [][]*Event{l.prev, l.cur} {
		i, _ := slices.BinarySearchFunc(seg, seq+1, func(e *Event, s uint64) int {
			return cmpUint(e.Seq, s)
		})
		out = append(out, seg[i:]...)
	}
	return out, l.changed, l.closed
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Watch yields the events that match f in sequence order: with since, the
// kept ones after since first (all of them when since is beyond the newest,
// as after a reset data dir), then live ones; without it (nil), only
// events appended from now on. It ends when ctx ends, EndWatches is called
// or the log closes.
// The events yielded are shared: callers must not change them.
func (l *Log) Watch(ctx context.Context, since *uint64, f Filter) iter.Seq[*Event] {
	return func(yield func(*Event) bool) {
		cursor := l.LastSeq()
		switch {
		case since != nil && *since > cursor:
			// The watcher saw events this log never had: the data dir was
			// reset, so everything in it is new to the watcher.
			cursor = 0
		case since != nil:
			cursor = *since
		}
		for {
			evs, changed, closed := l.after(cursor)
			for _, e := range evs {
				cursor = e.Seq
				if f.Match(e) && !yield(e) {
					return
				}
			}
			if closed {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-l.ending:
				return
			case <-changed:
			}
		}
	}
}

// EndWatches ends every watch, now and later, while appends go on: a
// server shutting down lets its streams finish and still logs the deletes
// that follow.
func (l *Log) EndWatches() { l.endOnce.Do(func() { close(l.ending) }) }

// Close closes the file and ends every watch.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.changed)
	l.changed = make(chan struct{})
	return l.file.Close()
}
