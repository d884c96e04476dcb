package xfs

import (
	"container/heap"
	"sync"
	"time"
)

// coolFor is how long a freed project id that still showed a charge waits
// before it is offered again. XFS frees unlinked inodes in the background
// (inodegc), usually within milliseconds of a Remove.
const coolFor = time.Second

// projectIDs hands out the lowest free XFS project ids. Keeping ids dense
// matters: XFS never shrinks its project quota file, whose size follows the
// highest id ever given limits, so ids grow only with the number of layers
// alive at once, not with the number ever created.
type projectIDs struct {
	mu      sync.Mutex
	used    map[uint32]struct{} // ids of live layers and removals in progress
	free    idHeap              // free ids below high
	high    uint32              // every id above is free
	cooling []cooled            // freed ids still charged, oldest first
}

type cooled struct {
	id uint32
	at time.Time
}

// reset makes the ids in live the only ones used (Open, from the
// filesystem); the gaps between them are free.
func (a *projectIDs) reset(live []uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.used = make(map[uint32]struct{}, len(live))
	a.free, a.high, a.cooling = nil, 0, nil
	for _, id := range live {
		a.used[id] = struct{}{}
		a.high = max(a.high, id)
	}
	for id := uint32(1); id < a.high; id++ {
		if _, ok := a.used[id]; !ok {
			a.free = append(a.free, id)
		}
	}
	heap.Init(&a.free)
}

// take reserves the lowest free id (never 0); ok is false when all 2^32-2
// are in use.
func (a *projectIDs) take(now time.Time) (id uint32, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.used == nil {
		a.used = map[uint32]struct{}{}
	}
	for len(a.cooling) > 0 && now.Sub(a.cooling[0].at) >= coolFor {
		heap.Push(&a.free, a.cooling[0].id)
		a.cooling = a.cooling[1:]
	}
	switch {
	case len(a.free) > 0:
		id = heap.Pop(&a.free).(uint32)
	case a.high < ^uint32(0)-1:
		a.high++
		id = a.high
	default:
		return 0, false
	}
	a.used[id] = struct{}{}
	return id, true
}

// release frees id for the next take.
func (a *projectIDs) release(id uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.used[id]; ok {
		delete(a.used, id)
		heap.Push(&a.free, id)
	}
}

// cool frees id but keeps it out of take for coolFor.
func (a *projectIDs) cool(id uint32, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.used[id]; ok {
		delete(a.used, id)
		a.cooling = append(a.cooling, cooled{id, now})
	}
}

// idHeap is a min-heap of ids.
type idHeap []uint32

func (h idHeap) Len() int           { return len(h) }
func (h idHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h idHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *idHeap) Push(x any)        { *h = append(*h, x.(uint32)) }
func (h *idHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
