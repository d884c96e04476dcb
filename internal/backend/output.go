package backend

import (
	"bytes"
	"errors"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// OutputBuffers collects a command's stdout and stderr: its Write is the
// OutputFunc, and the buffers are read once Exec has returned.
type OutputBuffers struct {
	mu             sync.Mutex
	Stdout, Stderr bytes.Buffer
}

// Write is an OutputFunc keeping stdout and stderr apart.
func (b *OutputBuffers) Write(st Stream, p []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st == Stdout {
		b.Stdout.Write(p)
	} else {
		b.Stderr.Write(p)
	}
	return nil
}

// OutputLimiter delivers output to an OutputFunc until a byte limit is
// reached. Backends share it so that every backend truncates the same way:
// the chunk that crosses the limit is cut at the limit, later chunks are
// dropped, and the backend closes its output pipes once Deliver reports the
// limit (the writer then gets EPIPE/SIGPIPE instead of filling memory).
type OutputLimiter struct {
	mu        sync.Mutex
	remaining int64
	out       OutputFunc
	truncated bool
}

// NewOutputLimiter returns a limiter passing at most limit bytes to out.
func NewOutputLimiter(limit int64, out OutputFunc) *OutputLimiter {
	return &OutputLimiter{remaining: limit, out: out}
}

// Deliver passes p (or the part that fits) to the OutputFunc. It returns
// more=false once the limit is reached; err is the OutputFunc's error.
func (l *OutputLimiter) Deliver(stream Stream, p []byte) (more bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.truncated {
		return false, nil
	}
	if int64(len(p)) > l.remaining {
		p = p[:l.remaining]
		l.truncated = true
	}
	l.remaining -= int64(len(p))
	if len(p) > 0 {
		if err := l.out(stream, p); err != nil {
			return false, err
		}
	}
	return !l.truncated, nil
}

// Truncated reports whether output was dropped.
func (l *OutputLimiter) Truncated() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.truncated
}

// pipeDrainMax bounds what CopyPipe reads past the deadline: what the pipe
// held, not what a background process keeps writing.
const pipeDrainMax = 1 << 20

// CopyPipe passes what a command writes to its output pipe f to deliver,
// until end of file, an error, or deliver returning false. Backends set a
// read deadline once the command exited, since a background process it
// left may hold the pipe open forever; past it CopyPipe still delivers
// what the pipe already holds, without waiting for more. The command's
// last output is still there when the reader was slow, as when it was
// delivering the chunk before: a plain read past its deadline would drop it.
func CopyPipe(f *os.File, buf []byte, deliver func([]byte) bool) {
	for {
		n, err := f.Read(buf)
		if n > 0 && !deliver(buf[:n]) {
			return
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			drainPipe(f, buf, deliver)
			return
		}
		if err != nil {
			return // EOF, or closed after the limit
		}
	}
}

// drainPipe delivers what is in the pipe: its fd is non-blocking, so a
// read of an empty pipe ends at once (EAGAIN).
func drainPipe(f *os.File, buf []byte, deliver func([]byte) bool) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	for total := 0; total < pipeDrainMax; {
		var n int
		if rc.Control(func(fd uintptr) { n, _ = unix.Read(int(fd), buf) }) != nil || n <= 0 {
			return
		}
		total += n
		if !deliver(buf[:n]) {
			return
		}
	}
}
