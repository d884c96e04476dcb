package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// MemoryWatch reads a group's OOM kill counter and memory peak, and resets
// the peak, through files held open: a pooled sandbox does this on every
// call, and an open and close of a cgroup file cost more than the read.
// Holding the file is also what makes the peak reset work on cgroup v2
// (Linux 6.12+), where a write to memory.peak resets the peak as seen
// through that open file only. Safe for use by one goroutine at a time.
type MemoryWatch struct {
	id         string
	events     *os.File // v1 memory.oom_control, v2 memory.events
	peak       *os.File // v1 memory.max_usage_in_bytes, v2 memory.peak
	buf        []byte
	resettable bool
}

// WatchMemory opens the group's memory files.
func (g *Group) WatchMemory() (*MemoryWatch, error) {
	events, peak := filepath.Join(g.v1["memory"], "memory.oom_control"), filepath.Join(g.v1["memory"], "memory.max_usage_in_bytes")
	if g.unified {
		events, peak = filepath.Join(g.v2, "memory.events"), filepath.Join(g.v2, "memory.peak")
	}
	w := &MemoryWatch{id: g.id, buf: make([]byte, 512), resettable: true}
	var err error
	if w.events, err = os.Open(events); err != nil {
		return nil, fmt.Errorf("cgroup %s: watch memory: %w", g.id, err)
	}
	if w.peak, err = os.OpenFile(peak, os.O_RDWR, 0); err != nil {
		w.events.Close()
		return nil, fmt.Errorf("cgroup %s: watch memory: %w", g.id, err)
	}
	return w, nil
}

// Close releases the files.
func (w *MemoryWatch) Close() error { return errors.Join(w.events.Close(), w.peak.Close()) }

func (w *MemoryWatch) read(f *os.File) ([]byte, error) {
	n, err := f.ReadAt(w.buf, 0)
	if n == 0 && err != nil {
		return nil, fmt.Errorf("cgroup %s: read %s: %w", w.id, filepath.Base(f.Name()), err)
	}
	return w.buf[:n], nil
}

// OOMKills is the group's OOM kill count.
func (w *MemoryWatch) OOMKills() (uint64, error) {
	b, err := w.read(w.events)
	if err != nil {
		return 0, err
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("oom_kill ")); ok {
			return strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
		}
	}
	return 0, fmt.Errorf("cgroup %s: no oom_kill counter", w.id)
}

// Peak is the highest memory use since the group was made or since the
// last ResetPeak.
func (w *MemoryWatch) Peak() (int64, error) {
	b, err := w.read(w.peak)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
}

// ResetPeak starts a new peak measurement from the current use (v1: write
// to memory.max_usage_in_bytes; v2: write to the held memory.peak, 6.12+).
// On a v2 kernel without peak reset it keeps the lifetime peak.
func (w *MemoryWatch) ResetPeak() error {
	if !w.resettable {
		return nil
	}
	if _, err := w.peak.WriteAt([]byte("0\n"), 0); err != nil {
		if errors.Is(err, os.ErrInvalid) || errors.Is(err, errors.ErrUnsupported) {
			w.resettable = false
			return nil
		}
		return fmt.Errorf("cgroup %s: reset memory peak: %w", w.id, err)
	}
	return nil
}
