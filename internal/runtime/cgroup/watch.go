package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Watch reads what a pooled sandbox's every call reads — its group's OOM
// kill counter, memory peak, CPU usage and processes — and resets the
// peak, through files held open: an open and close of a cgroup file cost
// ten times the read (about 30 us against 2 on the reference host). Holding
// the file is also what makes the peak reset work on cgroup v2 (Linux
// 6.12+), where a write to memory.peak resets the peak as seen through that
// open file only. Safe for use by one goroutine at a time.
type Watch struct {
	g          *Group
	events     *os.File // v1 memory.oom_control, v2 memory.events
	peak       *os.File // v1 memory.max_usage_in_bytes, v2 memory.peak
	cpu        *os.File // v1 cpuacct.usage, v2 cpu.stat (cpuStat)
	cpuStat    bool
	procs      *os.File // v2 cgroup.procs; nil without a v2 group
	buf        []byte
	resettable bool
}

// Watch opens the group's files.
func (g *Group) Watch() (*Watch, error) {
	peak := filepath.Join(g.v1["memory"], "memory.max_usage_in_bytes")
	if g.unified {
		peak = filepath.Join(g.v2, "memory.peak")
	}
	cpu, cpuStat := g.cpuFile()
	w := &Watch{g: g, buf: make([]byte, 4096), resettable: true, cpuStat: cpuStat}
	var err error
	open := func(file string, flag int) *os.File {
		if err != nil {
			return nil
		}
		var f *os.File
		if f, err = os.OpenFile(file, flag, 0); err != nil {
			err = fmt.Errorf("cgroup %s: watch: %w", g.id, err)
		}
		return f
	}
	w.events, w.peak, w.cpu = open(g.oomFile(), os.O_RDONLY), open(peak, os.O_RDWR), open(cpu, os.O_RDONLY)
	// A v1 cgroup.procs held open keeps serving the pid list it built
	// first (for up to a second); v2's is read afresh from offset 0.
	if g.v2 != "" {
		w.procs = open(filepath.Join(g.v2, "cgroup.procs"), os.O_RDONLY)
	}
	if err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// Close releases the files.
func (w *Watch) Close() error {
	var errs []error
	for _, f := range []*os.File{w.events, w.peak, w.cpu, w.procs} {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}

// wholeBelow: a cgroup file's read that returns fewer bytes than this
// returned the whole file. The kernel fills at least a page of its
// seq_file buffer before it stops short of the end, and the lines of these
// files are far shorter than the margin.
const wholeBelow = 4096 - 256

// read reads f whole from its start: in one pread for the small files read
// on every call (File.ReadAt reads again to see EOF), else to EOF, growing
// the buffer for a file that fills it (a cgroup.procs of many processes).
func (w *Watch) read(f *os.File) ([]byte, error) {
	// Through the raw fd: File.Fd would first take the file (in Go's
	// poller: kernfs files poll) out of non-blocking mode, a syscall more.
	var n int
	rc, err := f.SyscallConn()
	if err == nil {
		cerr := rc.Control(func(fd uintptr) { n, err = unix.Pread(int(fd), w.buf, 0) })
		if cerr != nil {
			err = cerr
		}
	}
	if err == nil && n < wholeBelow {
		return w.buf[:n], nil
	}
	for {
		n, err := f.ReadAt(w.buf, 0)
		if n == len(w.buf) {
			w.buf = make([]byte, 2*len(w.buf))
			continue
		}
		if n == 0 && err != nil && err != io.EOF {
			return nil, fmt.Errorf("cgroup %s: read %s: %w", w.g.id, filepath.Base(f.Name()), err)
		}
		return w.buf[:n], nil
	}
}

// CPUUsage is Group.CPUUsage through the held file.
func (w *Watch) CPUUsage() (time.Duration, error) {
	b, err := w.read(w.cpu)
	if err != nil {
		return 0, err
	}
	return w.g.parseCPUUsage(b, w.cpuStat)
}

// Procs is Group.Procs, through the held v2 file where there is one.
func (w *Watch) Procs() ([]int, error) {
	if w.procs == nil {
		return w.g.Procs()
	}
	b, err := w.read(w.procs)
	if err != nil {
		return nil, err
	}
	return parsePids(b), nil
}

// OOMKills is the group's OOM kill count.
func (w *Watch) OOMKills() (uint64, error) {
	b, err := w.read(w.events)
	if err != nil {
		return 0, err
	}
	n, err := keyValue(b, "oom_kill")
	if err != nil {
		return 0, fmt.Errorf("cgroup %s: oom counter: %w", w.g.id, err)
	}
	return n, nil
}

// Peak is the highest memory use since the group was made or since the
// last ResetPeak.
func (w *Watch) Peak() (int64, error) {
	b, err := w.read(w.peak)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
}

// ResetPeak starts a new peak measurement from the current use (v1: write
// to memory.max_usage_in_bytes; v2: write to the held memory.peak, 6.12+).
// On a v2 kernel without peak reset it keeps the lifetime peak.
func (w *Watch) ResetPeak() error {
	if !w.resettable {
		return nil
	}
	if _, err := w.peak.WriteAt([]byte("0\n"), 0); err != nil {
		if errors.Is(err, os.ErrInvalid) || errors.Is(err, errors.ErrUnsupported) {
			w.resettable = false
			return nil
		}
		return fmt.Errorf("cgroup %s: reset memory peak: %w", w.g.id, err)
	}
	return nil
}
