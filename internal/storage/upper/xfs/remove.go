package xfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// removeWorkers bounds the directories deleted in parallel. XFS spreads
// directories over allocation groups, so unlinks in different directories
// mostly do not contend. On this 2-core dev VM 4 workers deleted 10,000
// files in 100 dirs in 145-205 ms against 205-230 ms serially (8 workers:
// 320 ms; the host was busy, so treat these as rough). Small trees
// (most layers) stay on the caller's goroutine: only a directory of 16 or
// more entries, or a tree past parallelAfter entries, fans out.
const (
	removeWorkers = 4
	parallelAfter = 256
)

// removeTree deletes rel (relative to dirFd) and everything below it, with
// one unlinkat per entry (file types come from getdents, so there is no
// stat and no failed unlink-then-rmdir guess). Subdirectories are deleted in
// parallel. It does not stop for ctx: a half-deleted tree is worse than a
// slow one. ctx is accepted so a future cap on work can honour it.
func removeTree(_ context.Context, dirFd int, rel string) error {
	r := &remover{sem: make(chan struct{}, removeWorkers-1)}
	r.dir(dirFd, rel)
	return r.err
}

type remover struct {
	sem  chan struct{} // tokens for extra goroutines
	seen atomic.Int64  // entries met so far
	mu   sync.Mutex
	err  error
}

func (r *remover) setErr(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
}

// dir empties and removes name in parent. Subdirectories go to another
// goroutine when a token is free, else are done inline (depth-first).
func (r *remover) dir(parent int, name string) {
	if err := r.empty(parent, name); err != nil {
		r.setErr(err)
		return
	}
	if err := unix.Unlinkat(parent, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		r.setErr(fmt.Errorf("rmdir %s: %w", name, err))
	}
}

func (r *remover) empty(parent int, name string) error {
	fd, err := unix.Openat(parent, name, dirFlags, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var sub sync.WaitGroup
	for {
		entries, err := f.ReadDir(1024)
		parallel := r.seen.Add(int64(len(entries))) > parallelAfter || len(entries) >= 16
		for _, e := range entries {
			if !e.IsDir() {
				if err := unix.Unlinkat(fd, e.Name(), 0); err != nil && !errors.Is(err, unix.ENOENT) {
					return fmt.Errorf("unlink %s/%s: %w", name, e.Name(), err)
				}
				continue
			}
			if !parallel {
				r.dir(fd, e.Name())
				continue
			}
			select {
			case r.sem <- struct{}{}:
				sub.Add(1)
				go func(n string) {
					defer func() { <-r.sem; sub.Done() }()
					r.dir(fd, n)
				}(e.Name())
			default:
				r.dir(fd, e.Name())
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(entries) == 0) {
			break
		}
		if err != nil {
			sub.Wait()
			return fmt.Errorf("read dir %s: %w", name, err)
		}
	}
	sub.Wait() // f (and fd) must outlive the goroutines using it
	return nil
}
