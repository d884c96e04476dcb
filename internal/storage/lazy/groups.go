package lazy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Reads are attributed to groups (the node's sandboxes) by the pid the
// kernel names as the reader: Config.Attribute maps it to a group name.
// EROFS issues its reads of the blob in the reading task's context, so the
// pid is the sandbox process's (as seen from the node's pid namespace).

// groupTTL is how long a pid's group is remembered: Attribute may read
// /proc, and a start makes hundreds of reads.
const groupTTL = time.Second

// GroupStats are one group's reads through the lazy files.
type GroupStats struct {
	Group        string  `json:"group"`
	BytesRead    int64   `json:"bytes_read"`
	BytesFetched int64   `json:"bytes_fetched"` // fetches this group's reads started
	Hits         int64   `json:"hits"`
	Misses       int64   `json:"misses"`
	HitRate      float64 `json:"hit_rate"`
}

type groupCounters struct {
	bytesRead, bytesFetched, hits, misses atomic.Int64
}

type pidGroup struct {
	group string
	at    time.Time
}

type groups struct {
	attribute func(pid uint32) string
	mu        sync.Mutex
	byPid     map[uint32]pidGroup
	counters  map[string]*groupCounters
}

// of returns the counters of ctx's reader, nil when unattributed.
func (g *groups) of(ctx context.Context) *groupCounters {
	if g.attribute == nil {
		return nil
	}
	caller, ok := fuse.FromContext(ctx)
	if !ok {
		return nil
	}
	now := time.Now()
	g.mu.Lock()
	pg, ok := g.byPid[caller.Pid]
	g.mu.Unlock()
	if !ok || now.Sub(pg.at) > groupTTL {
		pg = pidGroup{group: g.attribute(caller.Pid), at: now}
		g.mu.Lock()
		if len(g.byPid) > 4096 { // forget stale pids wholesale
			clear(g.byPid)
		}
		g.byPid[caller.Pid] = pg
		g.mu.Unlock()
	}
	if pg.group == "" {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.counters[pg.group]
	if c == nil {
		c = &groupCounters{}
		g.counters[pg.group] = c
	}
	return c
}

// GroupStats returns the figures of group ("" counters are not kept).
func (f *FS) GroupStats(group string) GroupStats {
	f.groups.mu.Lock()
	c := f.groups.counters[group]
	f.groups.mu.Unlock()
	s := GroupStats{Group: group}
	if c == nil {
		return s
	}
	s.BytesRead, s.BytesFetched = c.bytesRead.Load(), c.bytesFetched.Load()
	s.Hits, s.Misses = c.hits.Load(), c.misses.Load()
	if t := s.Hits + s.Misses; t > 0 {
		s.HitRate = float64(s.Hits) / float64(t)
	}
	return s
}

// ForgetGroup drops group's counters (its sandbox is gone).
func (f *FS) ForgetGroup(group string) {
	f.groups.mu.Lock()
	defer f.groups.mu.Unlock()
	delete(f.groups.counters, group)
}
