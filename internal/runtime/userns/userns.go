// Package userns owns the user namespaces of container sandboxes: the
// node-wide allocator of host uid/gid ranges (one per sandbox, persisted by
// a Slots store so that ranges survive daemon restarts) and the idmapped
// mounts through which a sandbox sees the node's read-only layers and its
// writable layer as its own. It imports only the standard library and
// golang.org/x/sys/unix; never the backend, node or state packages (the
// state package implements Slots).
package userns

import (
	"errors"
	"fmt"
	"sync"
)

// Range is a block of host ids that a sandbox's user namespace maps to its
// ids 0..Size-1, for uids and gids alike.
type Range struct {
	// Host is the host uid (and gid) of the sandbox's root.
	Host uint32 `json:"host"`
	Size uint32 `json:"size"`
}

const (
	// First is the host id of the first range, far above the ids of host
	// accounts (and of nobody, 65534).
	First = 1 << 20
	// Size is the ids each sandbox gets: 0..65535, what images use
	// (nobody is 65534).
	Size = 1 << 16
	// Count is how many ranges fit below 2^32-1 (the invalid id).
	Count = (1<<32 - 1 - First) / Size
)

// At returns the range of slot i.
func At(slot int) Range {
	return Range{Host: uint32(First + slot*Size), Size: Size}
}

// Contains reports whether host id id lies in r.
func (r Range) Contains(id uint32) bool { return id >= r.Host && id-r.Host < r.Size }

// Overflow is the id under which a sandbox sees host ids outside its range
// (the kernel's overflowuid, nobody).
const Overflow = 65534

// Inside returns what host id id is inside a user namespace mapped to r.
func (r Range) Inside(id uint32) uint32 {
	if !r.Contains(id) {
		return Overflow
	}
	return id - r.Host
}

// Map is r as one line of /proc/<pid>/uid_map (and gid_map).
func (r Range) Map() string { return fmt.Sprintf("0 %d %d", r.Host, r.Size) }

// Slots persists which owner (a sandbox id) holds which slot.
type Slots interface {
	// Claim gives owner the lowest free slot below n, or the slot it
	// already holds, atomically.
	Claim(owner string, n int) (int, error)
	// Free releases owner's slot; no-op if it holds none.
	Free(owner string) error
	// Owners lists the owners holding a slot.
	Owners() ([]string, error)
}

// ErrExhausted is returned when every slot is taken.
var ErrExhausted = errors.New("every user namespace id range is in use")

// Allocator hands out ranges backed by a Slots store.
type Allocator struct{ slots Slots }

// NewAllocator returns an allocator over slots.
func NewAllocator(slots Slots) *Allocator { return &Allocator{slots: slots} }

// Allocate returns owner's range, claiming one if it has none.
func (a *Allocator) Allocate(owner string) (Range, error) {
	slot, err := a.slots.Claim(owner, Count)
	if err != nil {
		return Range{}, fmt.Errorf("allocate id range for %s: %w", owner, err)
	}
	return At(slot), nil
}

// Release frees owner's range.
func (a *Allocator) Release(owner string) error {
	if err := a.slots.Free(owner); err != nil {
		return fmt.Errorf("release id range of %s: %w", owner, err)
	}
	return nil
}

// Owners lists the owners holding a range (for sweeps).
func (a *Allocator) Owners() ([]string, error) { return a.slots.Owners() }

// MemSlots is a Slots in memory, for a node without state on disk (tests
// and benchmarks): ranges are unique within the process only.
type MemSlots struct {
	mu     sync.Mutex
	owners map[string]int
	taken  map[int]bool
}

// Claim implements Slots.
func (m *MemSlots) Claim(owner string, n int) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.owners == nil {
		m.owners, m.taken = map[string]int{}, map[int]bool{}
	}
	if s, ok := m.owners[owner]; ok {
		return s, nil
	}
	for s := range n {
		if !m.taken[s] {
			m.owners[owner], m.taken[s] = s, true
			return s, nil
		}
	}
	return 0, ErrExhausted
}

// Free implements Slots.
func (m *MemSlots) Free(owner string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.owners[owner]; ok {
		delete(m.owners, owner)
		delete(m.taken, s)
	}
	return nil
}

// Owners implements Slots.
func (m *MemSlots) Owners() ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.owners))
	for o := range m.owners {
		out = append(out, o)
	}
	return out, nil
}
