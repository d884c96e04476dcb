package fncall

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

// zygoteSource is the warm python (see zygote.py): a pre-started python3
// per pooled sandbox that forks one child per python call, which saves the
// interpreter's start-up (most of a short call's CPU). It survives clean
// resets (Resetter.Reset's keep); a reset that finds the filesystem written
// kills it, and it is started again on the next python call.
//
//go:embed zygote.py
var zygoteSource string

// maxWarmStdin is the largest stdin the zygote takes (one pipe buffer);
// calls with more run cold.
const maxWarmStdin = 64 << 10

// zygote is one running warm python.
type zygote struct {
	pid    int
	stdin  *io.PipeWriter
	lines  chan []byte
	done   chan struct{} // its Exec returned
	cancel context.CancelFunc
}

// zygoteRequest and zygoteReply are zygote.py's JSON lines.
type zygoteRequest struct {
	Src   string            `json:"src"`
	Stdin []byte            `json:"stdin,omitempty"`
	Env   map[string]string `json:"env"`
	CPU   int64             `json:"cpu"`
	Cap   int64             `json:"cap"`
	Wall  float64           `json:"wall"`
}

type zygoteReply struct {
	Code      int    `json:"code"`
	CPUNanos  int64  `json:"cpu_ns"`
	Out       []byte `json:"out"`
	Err       []byte `json:"err"`
	TimedOut  bool   `json:"timed_out"`
	Truncated bool   `json:"truncated"`
}

// warmSet tracks the zygotes of the service's sandboxes.
type warmSet struct {
	mu  sync.Mutex
	zyg map[string]*zygote // by sandbox id
}

// get returns sb's zygote, starting one if it has none (or it died).
func (w *warmSet) get(sb backend.Sandbox, env []string, preload []string) (*zygote, error) {
	w.mu.Lock()
	z := w.zyg[sb.ID()]
	w.mu.Unlock()
	if z != nil {
		select {
		case <-z.done:
		default:
			return z, nil
		}
	}
	z, err := startZygote(sb, env, preload)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.zyg[sb.ID()] = z
	w.mu.Unlock()
	return z, nil
}

// keep is the pid a reset of sb must spare (nil without a live zygote).
func (w *warmSet) keep(sb backend.Sandbox) []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if z := w.zyg[sb.ID()]; z != nil {
		select {
		case <-z.done:
		default:
			return []int{z.pid}
		}
	}
	return nil
}

// drop forgets (and stops) sb's zygote.
func (w *warmSet) drop(sb backend.Sandbox) {
	w.mu.Lock()
	z := w.zyg[sb.ID()]
	delete(w.zyg, sb.ID())
	w.mu.Unlock()
	if z != nil {
		z.stop()
	}
}

func startZygote(sb backend.Sandbox, env []string, preload []string) (*zygote, error) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	z := &zygote{stdin: pw, lines: make(chan []byte, 1), done: make(chan struct{}), cancel: cancel}
	lw := &lineWriter{out: z.lines}
	// -B: the warm python writes no bytecode. Its start compiles
	// sitecustomize (and preloads) into __pycache__ on the view, which
	// made every reset dirty and so restarted it on every call of a stock
	// image. Calls forked from it inherit the setting: their caches would
	// go with the view at the reset anyway.
	spec := backend.ExecSpec{Argv: []string{"python3", "-B", "-c", zygoteSource},
		Env: append(env, "CORRAL_PRELOAD="+strings.Join(preload, ",")), Cwd: "/", StdinReader: pr}
	go func() {
		defer close(z.done)
		_, _ = sb.Exec(ctx, spec, func(st backend.Stream, p []byte) error {
			if st == backend.Stdout {
				lw.Write(p)
			}
			return nil
		})
		pr.Close()
	}()
	var hello struct {
		Pid int `json:"pid"`
	}
	if err := z.read(30*time.Second, &hello); err != nil {
		z.stop()
		return nil, fmt.Errorf("start warm python: %w", err)
	}
	z.pid = hello.Pid
	return z, nil
}

// read waits for the next reply line.
func (z *zygote) read(timeout time.Duration, v any) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case line := <-z.lines:
		return json.Unmarshal(line, v)
	case <-z.done:
		return errors.New("warm python exited")
	case <-t.C:
		return errors.New("warm python does not answer")
	}
}

// errNotStarted: the warm python failed before the call's code started,
// so the call can run cold instead.
var errNotStarted = errors.New("warm python failed before the call started")

// errRetired: the warm python found its scheduling state changed by an
// earlier call and exited before this call started (see zygote.py); a
// fresh one serves the call.
var errRetired = fmt.Errorf("%w: it retired", errNotStarted)

// call runs one request; on error the zygote is unusable.
func (z *zygote) call(req zygoteRequest) (zygoteReply, error) {
	var r zygoteReply
	b, err := json.Marshal(req)
	if err != nil {
		return r, err
	}
	if _, err := z.stdin.Write(append(b, '\n')); err != nil {
		return r, fmt.Errorf("%w: %v", errNotStarted, err)
	}
	var ack struct {
		Started int    `json:"started"`
		Error   string `json:"error"`
	}
	if err := z.read(5*time.Second, &ack); err != nil || ack.Started == 0 {
		if strings.HasPrefix(ack.Error, "retired") {
			return r, fmt.Errorf("%w: %s", errRetired, ack.Error)
		}
		return r, fmt.Errorf("%w: %v %s", errNotStarted, err, ack.Error)
	}
	return r, z.read(time.Duration(req.Wall*float64(time.Second))+5*time.Second, &r)
}

func (z *zygote) stop() {
	z.stdin.Close()
	z.cancel()
}

// lineWriter splits a byte stream into lines.
type lineWriter struct {
	buf []byte
	out chan []byte
}

func (l *lineWriter) Write(p []byte) {
	l.buf = append(l.buf, p...)
	for {
		i := strings.IndexByte(string(l.buf), '\n')
		if i < 0 {
			return
		}
		line := append([]byte(nil), l.buf[:i]...)
		l.buf = l.buf[i+1:]
		l.out <- line
	}
}
