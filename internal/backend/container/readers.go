package container

import (
	"os"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

// readers copy one exec's stdout and stderr through the output limiter.
type readers struct {
	lim       *backend.OutputLimiter
	wg        sync.WaitGroup
	closeOnce sync.Once
	outErr    chan error
	files     []*os.File
	mu        sync.Mutex
	firstErr  error
}

func (r *readers) start(f *os.File, stream backend.Stream) {
	r.files = append(r.files, f)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.copy(f, stream)
	}()
}

// readBufs are the readers' buffers, reused across execs: two fresh 32 KiB
// buffers per exec were most of an exec's garbage.
var readBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (r *readers) copy(f *os.File, stream backend.Stream) {
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	backend.CopyPipe(f, *bp, func(p []byte) bool { return r.deliver(stream, p) })
}

// deliver passes p on; false stops reading (limit reached or callback error,
// in which case the pipes are closed so the writers get SIGPIPE).
func (r *readers) deliver(stream backend.Stream, p []byte) bool {
	more, err := r.lim.Deliver(stream, p)
	if err != nil {
		r.mu.Lock()
		if r.firstErr == nil {
			r.firstErr = err
			r.outErr <- err
		}
		r.mu.Unlock()
	}
	if !more {
		r.closeOnce.Do(func() {
			for _, f := range r.files {
				f.Close()
			}
		})
	}
	return more
}

// finish stops waiting for output: what is in the pipes is drained, then the
// readers end even if background processes hold the write ends open.
func (r *readers) finish(files ...*os.File) {
	now := time.Now()
	for _, f := range files {
		_ = f.SetReadDeadline(now)
	}
	r.wg.Wait()
}

func (r *readers) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.firstErr
}
