package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// reclaimFloor is the limit a v1 reclaim asks for: the kernel frees (or
// swaps out) everything it can on the way down and stops where it cannot.
const reclaimFloor = 1 << 20

// Memory is a group's memory split by where it is now.
type Memory struct {
	ResidentBytes int64 // charged to RAM, page cache included
	SwappedBytes  int64 // in swap
}

// Memory reads the group's resident and swapped bytes.
func (g *Group) Memory() (Memory, error) {
	var m Memory
	var err error
	if g.unified {
		if m.ResidentBytes, err = readInt(filepath.Join(g.v2, "memory.current")); err != nil {
			return m, fmt.Errorf("cgroup %s: memory: %w", g.id, err)
		}
		if swap, err := readInt(filepath.Join(g.v2, "memory.swap.current")); err == nil {
			m.SwappedBytes = swap
		}
		return m, nil
	}
	d := g.v1["memory"]
	if m.ResidentBytes, err = readInt(filepath.Join(d, "memory.usage_in_bytes")); err != nil {
		return m, fmt.Errorf("cgroup %s: memory: %w", g.id, err)
	}
	// total_swap exists only with swap accounting (memsw files).
	if swap, err := readKey(filepath.Join(d, "memory.stat"), "total_swap"); err == nil {
		m.SwappedBytes = int64(swap)
	}
	return m, nil
}

// Reclaim pushes the group's memory out of RAM (to swap for anonymous
// pages, dropped for clean page cache) and returns where it was before and
// after. The group should be frozen, so that nothing faults pages back in
// meanwhile. v1 lowers memory.limit_in_bytes to a floor (the kernel
// reclaims down to it, or as far as it can) and restores the limit;
// v2 writes memory.reclaim. The limit is restored even on failure.
func (g *Group) Reclaim() (before, after Memory, err error) {
	if before, err = g.Memory(); err != nil {
		return before, before, err
	}
	if g.unified {
		// Create sets memory.swap.max to 0; a reclaim may swap up to the
		// memory limit (as v1's memsw limit allows), and what it swapped
		// stays there until touched.
		if lim, err := os.ReadFile(filepath.Join(g.v2, "memory.max")); err == nil {
			if _, err := os.Stat(filepath.Join(g.v2, "memory.swap.max")); err == nil {
				if err := os.WriteFile(filepath.Join(g.v2, "memory.swap.max"), lim, 0); err != nil {
					return before, before, fmt.Errorf("cgroup %s: allow swap for reclaim: %w", g.id, err)
				}
			}
		}
		err = write(g.v2, "memory.reclaim", strconv.FormatInt(before.ResidentBytes, 10))
		// EAGAIN: it reclaimed less than asked, which is all there was.
		if err != nil && !errors.Is(err, syscall.EAGAIN) {
			return before, before, fmt.Errorf("cgroup %s: reclaim: %w", g.id, err)
		}
	} else if err = g.reclaimV1(); err != nil {
		return before, before, err
	}
	after, err = g.Memory()
	return before, after, err
}

func (g *Group) reclaimV1() error {
	d := g.v1["memory"]
	limitFile := filepath.Join(d, "memory.limit_in_bytes")
	orig, err := os.ReadFile(limitFile)
	if err != nil {
		return fmt.Errorf("cgroup %s: read memory limit: %w", g.id, err)
	}
	err = write(d, "memory.limit_in_bytes", strconv.Itoa(reclaimFloor))
	// EBUSY: it could not get under the floor; what it freed stays freed.
	if err != nil && !errors.Is(err, syscall.EBUSY) {
		return fmt.Errorf("cgroup %s: reclaim: %w", g.id, err)
	}
	if err := os.WriteFile(limitFile, orig, 0); err != nil {
		return fmt.Errorf("cgroup %s: restore memory limit after reclaim: %w", g.id, err)
	}
	return nil
}
