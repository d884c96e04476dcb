package node

import (
	"context"
	"io"
	"maps"
	"slices"
	"sort"
	"sync"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// subscriberQueueBytes bounds the output queued for one subscriber of a
// process; a subscriber that falls further behind is dropped, so a stalled
// client cannot grow the node's memory.
const subscriberQueueBytes = 16 << 20

// ProcessRequest starts a long-running process: it keeps running after
// the call that started it, and can be listed, re-attached to, signalled
// and fed input until it exits.
type ProcessRequest struct {
	ExecRequest
	// Tag is a caller's name for the process (may be empty).
	Tag string
	// Stdin keeps the process's stdin open for Write and CloseStdin
	// (otherwise it reads /dev/null). A PTY process always has input.
	Stdin bool
	// PTY runs the process on a terminal of that size.
	PTY *backend.TermSize
}

// ProcessEvent is output of a process, or its end (End set, last event).
type ProcessEvent struct {
	Stream backend.Stream
	Data   []byte
	End    *ProcessEnd
}

// ProcessEnd is how a process ended; Err is set when the node lost it
// (sandbox stopped, exec failed) rather than seeing it exit.
type ProcessEnd struct {
	Result backend.ExecResult
	Err    error
}

// Process is a long-running process of a sandbox.
type Process struct {
	Pid     int
	Tag     string
	Request ProcessRequest

	handle backend.Process
	stdin  *io.PipeWriter // nil without input
	cancel context.CancelFunc

	mu   sync.Mutex
	subs map[*Subscription]struct{}
	end  *ProcessEnd
	done chan struct{}
}

// processTable holds the live processes of every sandbox of the node. Its
// zero value is ready to use.
type processTable struct {
	mu    sync.Mutex
	procs map[string]map[int]*Process // sandbox id -> pid -> process
}

func (t *processTable) add(id string, p *Process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs == nil {
		t.procs = map[string]map[int]*Process{}
	}
	if t.procs[id] == nil {
		t.procs[id] = map[int]*Process{}
	}
	t.procs[id][p.Pid] = p
}

func (t *processTable) remove(id string, p *Process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs[id][p.Pid] == p {
		delete(t.procs[id], p.Pid)
		if len(t.procs[id]) == 0 {
			delete(t.procs, id)
		}
	}
}

func (t *processTable) list(id string) []*Process {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := slices.Collect(maps.Values(t.procs[id]))
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out
}

// StartProcess starts a process and returns it with a subscription that
// sees all of its output. ctx bounds only the start: the process runs
// until it exits, is signalled, its timeout (default the node's longest
// exec timeout) passes, or the sandbox stops.
func (n *Node) StartProcess(ctx context.Context, id string, req ProcessRequest) (*Process, *Subscription, error) {
	e, sb, err := n.acquire(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := sb.(backend.Interactive); !ok {
		e.release()
		return nil, nil, errdefs.NotSupported("not supported: long-running processes on backend %s (needs an interactive exec; use Exec)", e.backend.Name())
	}
	if req.Timeout == 0 {
		req.Timeout = n.cfg.Limits.MaxExecTimeout
	}
	if req.OutputLimit == 0 {
		req.OutputLimit = n.cfg.Limits.MaxOutputLimit
	}
	if req.PTY != nil && (req.PTY.Cols == 0 || req.PTY.Rows == 0) {
		e.release()
		return nil, nil, errdefs.InvalidArgument("pty.size: columns and rows must be positive (got %dx%d)", req.PTY.Cols, req.PTY.Rows)
	}
	spec, err := n.execSpec(e.snapshot(), req.ExecRequest)
	if err != nil {
		e.release()
		return nil, nil, err
	}
	p := &Process{Tag: req.Tag, Request: req, subs: map[*Subscription]struct{}{}, done: make(chan struct{})}
	spec.PTY = req.PTY
	if req.Stdin || req.PTY != nil {
		r, w := io.Pipe()
		spec.StdinReader, p.stdin = r, w
	}
	sub := p.Subscribe()
	started := make(chan struct{})
	spec.Started = func(h backend.Process) {
		p.handle, p.Pid = h, h.Pid()
		n.procs.add(id, p)
		close(started)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	go func() {
		defer e.release()
		defer cancel()
		res, err := sb.Exec(runCtx, spec, p.output)
		n.procs.remove(id, p)
		p.finish(ProcessEnd{Result: res, Err: err})
	}()
	select {
	case <-started:
		return p, sub, nil
	case <-p.done:
		return nil, nil, p.end.Err
	}
}

// Processes lists the running processes of a sandbox by pid.
func (n *Node) Processes(_ context.Context, id string) ([]*Process, error) {
	if _, err := n.lookup(id); err != nil {
		return nil, err
	}
	return n.procs.list(id), nil
}

// FindProcess returns the running process of a sandbox with that pid, or
// (pid 0) that tag.
func (n *Node) FindProcess(ctx context.Context, id string, pid int, tag string) (*Process, error) {
	procs, err := n.Processes(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, p := range procs {
		if (pid != 0 && p.Pid == pid) || (pid == 0 && tag != "" && p.Tag == tag) {
			return p, nil
		}
	}
	if pid != 0 {
		return nil, errdefs.NotFound("process %d not found in sandbox %s", pid, id)
	}
	return nil, errdefs.NotFound("process with tag %q not found in sandbox %s", tag, id)
}

// output fans a chunk out to every subscriber.
func (p *Process) output(stream backend.Stream, data []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.subs {
		s.push(ProcessEvent{Stream: stream, Data: append([]byte(nil), data...)})
	}
	return nil
}

func (p *Process) finish(end ProcessEnd) {
	if p.stdin != nil {
		p.stdin.CloseWithError(io.ErrClosedPipe)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.end = &end
	for s := range p.subs {
		s.push(ProcessEvent{End: &end})
		s.closeLocked()
	}
	p.subs = nil
	close(p.done)
}

// Done is closed when the process has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// Subscribe returns a subscription to the process's output from now on
// and to its end; an ended process gives one that only reports the end.
func (p *Process) Subscribe() *Subscription {
	s := &Subscription{p: p, notify: make(chan struct{}, 1)}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		s.push(ProcessEvent{End: p.end})
		s.closeLocked()
		return s
	}
	p.subs[s] = struct{}{}
	return s
}

// Write feeds the process's stdin (its terminal's input for a PTY).
func (p *Process) Write(data []byte) error {
	if p.stdin == nil {
		return errdefs.FailedPrecondition("process %d: stdin is not open (start it with stdin)", p.Pid)
	}
	if _, err := p.stdin.Write(data); err != nil {
		return errdefs.FailedPrecondition("process %d: stdin is closed", p.Pid)
	}
	return nil
}

// CloseStdin ends the process's stdin (EOF).
func (p *Process) CloseStdin() error {
	if p.stdin == nil || p.Request.PTY != nil {
		return errdefs.FailedPrecondition("process %d: no stdin to close (a terminal takes Ctrl-D instead)", p.Pid)
	}
	return p.stdin.Close()
}

// Signal signals the process's group.
func (p *Process) Signal(sig int) error {
	if sig <= 0 || sig > 64 {
		return errdefs.InvalidArgument("signal: %d is not a signal number", sig)
	}
	return p.handle.Signal(sig)
}

// Resize changes the size of the process's terminal.
func (p *Process) Resize(size backend.TermSize) error {
	if p.Request.PTY == nil {
		return errdefs.FailedPrecondition("process %d: has no terminal to resize", p.Pid)
	}
	if size.Cols == 0 || size.Rows == 0 {
		return errdefs.InvalidArgument("pty.size: columns and rows must be positive (got %dx%d)", size.Cols, size.Rows)
	}
	return p.handle.Resize(size)
}

// Subscription is one reader of a process's events.
type Subscription struct {
	p      *Process
	mu     sync.Mutex
	queue  []ProcessEvent
	bytes  int
	closed bool
	lost   bool
	notify chan struct{}
}

// push queues an event; called with p.mu held.
func (s *Subscription) push(ev ProcessEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.bytes+len(ev.Data) > subscriberQueueBytes && ev.End == nil {
		s.lost, s.closed = true, true
		delete(s.p.subs, s)
	} else {
		s.queue = append(s.queue, ev)
		s.bytes += len(ev.Data)
	}
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *Subscription) closeLocked() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Next returns the next event; after the end event it returns io.EOF.
func (s *Subscription) Next(ctx context.Context) (ProcessEvent, error) {
	for {
		s.mu.Lock()
		if len(s.queue) > 0 {
			ev := s.queue[0]
			s.queue = s.queue[1:]
			s.bytes -= len(ev.Data)
			s.mu.Unlock()
			return ev, nil
		}
		closed, lost := s.closed, s.lost
		s.mu.Unlock()
		if lost {
			return ProcessEvent{}, errdefs.ResourceExhausted("process %d: reader fell more than %d bytes behind the output", s.p.Pid, subscriberQueueBytes)
		}
		if closed {
			return ProcessEvent{}, io.EOF
		}
		select {
		case <-ctx.Done():
			return ProcessEvent{}, ctx.Err()
		case <-s.notify:
		}
	}
}

// Close stops the subscription; the process keeps running.
func (s *Subscription) Close() {
	s.p.mu.Lock()
	delete(s.p.subs, s)
	s.p.mu.Unlock()
	s.closeLocked()
}
