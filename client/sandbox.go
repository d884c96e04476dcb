package client

import (
	"context"
	"io"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// State is a sandbox's lifecycle state.
type State string

const (
	StateRunning State = "running"
	StatePaused  State = "paused"
	StateStopped State = "stopped"
	// StateLost: the sandbox's cluster node stopped renewing its lease
	// (Info.StopReason says which and when).
	StateLost State = "lost"
)

var stateFromProto = map[corralv1.SandboxState]State{
	corralv1.SandboxState_SANDBOX_STATE_RUNNING: StateRunning,
	corralv1.SandboxState_SANDBOX_STATE_PAUSED:  StatePaused,
	corralv1.SandboxState_SANDBOX_STATE_STOPPED: StateStopped,
	corralv1.SandboxState_SANDBOX_STATE_LOST:    StateLost,
}

// Resources are a sandbox's limits; zero fields take the server's defaults.
type Resources struct {
	CPUMillis   int64 // 1000 = one core
	MemoryBytes int64
	DiskBytes   int64
	Pids        int64
	// BestEffort: the sandbox only gets CPU time others leave idle, so
	// that batch work never slows interactive sandboxes on the node.
	BestEffort bool
	// IO bounds the sandbox's disk I/O (container backend); zero fields
	// take the node's limits, which are also the most it may ask for.
	IO IOLimits
}

// IOLimits bound disk I/O, per second.
type IOLimits struct {
	ReadBytesPerSec, WriteBytesPerSec int64
	ReadOpsPerSec, WriteOpsPerSec     int64
}

// CreateOptions describe a new sandbox. Only Image is commonly set.
type CreateOptions struct {
	Backend   string // "container" (default) or "microvm"
	Image     string // e.g. "busybox", "debian"
	Resources Resources
	Env       map[string]string
	Workdir   string
	User      string
	Labels    map[string]string
	// IdleTimeout stops the sandbox after no request for this long; nil
	// takes the server default, a pointer to 0 means never.
	IdleTimeout *time.Duration
	// MaxLifetime stops the sandbox this long after creation; nil takes the
	// server default.
	MaxLifetime *time.Duration
	// Network is the sandbox's network policy; the zero value is
	// NetworkNone (loopback only).
	Network Network
	// Placement constrains the node in a cluster (ignored by one node).
	Placement Placement
	// IdleAction is what IdleTimeout does: "stop" (default), "pause" or
	// "reclaim" (see Sandbox.Reclaim); the next request resumes.
	IdleAction string
	// Fresh asks for a sandbox made from scratch for this create and torn
	// down by its delete: never one made ahead of demand or recycled from
	// the project's deletes, and never recycled itself.
	Fresh bool
}

// Info describes a sandbox.
type Info struct {
	ID           string
	NodeID       string
	Backend      string
	Image        string
	State        State
	Resources    Resources
	Env          []string
	Workdir      string
	User         string
	Labels       map[string]string
	IdleTimeout  time.Duration
	MaxLifetime  time.Duration
	CreatedAt    time.Time
	LastActiveAt time.Time
	StopReason   string
	Network      Network
	// Degraded says why a layer of the sandbox cannot be read (its blob
	// store is unreachable): reads of unfetched files fail with EIO. Empty
	// when healthy.
	Degraded string
	// LazyReads are the sandbox's reads of lazily loaded layers (Get only;
	// nil when the node loads no layer lazily).
	LazyReads *LazyReads
	// Project is the project the sandbox belongs to ("": the node
	// administrator's, outside any project).
	Project string
	// Memory is where the sandbox's memory is now (Get only; nil when the
	// backend does not tell).
	Memory *Memory
	// IdleAction is what IdleTimeout does: stop, pause or reclaim.
	IdleAction string
	// MigratingTo is set on the sandbox's node while a migration to that
	// node has it fenced (paused; other calls fail Unavailable: retry).
	MigratingTo string
}

// LazyReads count a sandbox's reads of lazily loaded layer data.
type LazyReads struct {
	BytesRead    int64
	BytesFetched int64 // by fetches its reads started
	Hits, Misses int64 // chunk reads served from the node's cache / that waited for a fetch
	HitRate      float64
}

func infoFromProto(p *corralv1.Sandbox) *Info {
	r := p.GetResources()
	return &Info{
		ID: p.Id, NodeID: p.NodeId, Backend: p.Backend, Image: p.Image,
		State: stateFromProto[p.State],
		Resources: Resources{
			CPUMillis: r.GetCpuMillis(), MemoryBytes: r.GetMemoryBytes(),
			DiskBytes: r.GetDiskBytes(), Pids: r.GetPids(), BestEffort: r.GetBestEffort(),
			IO: IOLimits{ReadBytesPerSec: r.GetIo().GetReadBps(), WriteBytesPerSec: r.GetIo().GetWriteBps(),
				ReadOpsPerSec: r.GetIo().GetReadIops(), WriteOpsPerSec: r.GetIo().GetWriteIops()},
		},
		Env: p.Env, Workdir: p.Workdir, User: p.User, Labels: p.Labels,
		IdleTimeout: p.IdleTimeout.AsDuration(), MaxLifetime: p.MaxLifetime.AsDuration(),
		CreatedAt: p.CreatedAt.AsTime(), LastActiveAt: p.LastActiveAt.AsTime(),
		StopReason: p.StopReason,
		Network:    networkFromProto(p.GetNetwork()),
		Degraded:   p.Degraded,
		LazyReads:  lazyReadsFromProto(p.GetLazyReads()),
		Project:    p.Project,
		Memory:     memoryFromProto(p.GetMemory()),
		IdleAction: p.IdleAction,

		MigratingTo: p.MigratingTo,
	}
}

func memoryFromProto(m *corralv1.MemoryState) *Memory {
	if m == nil {
		return nil
	}
	return &Memory{ResidentBytes: m.ResidentBytes, SwappedBytes: m.SwappedBytes, Reclaimed: m.Reclaimed}
}

func lazyReadsFromProto(l *corralv1.LazyReadStats) *LazyReads {
	if l == nil {
		return nil
	}
	return &LazyReads{BytesRead: l.BytesRead, BytesFetched: l.BytesFetched, Hits: l.Hits, Misses: l.Misses, HitRate: l.HitRate}
}

func optionalDuration(d *time.Duration) *durationpb.Duration {
	if d == nil {
		return nil
	}
	return durationpb.New(*d)
}

// Sandbox is a handle on one sandbox. It holds no state besides the id
// and the count of Idempotent commands sent through it.
type Sandbox struct {
	c  *Client
	id string

	steps atomic.Uint64 // Idempotent commands so far (their step numbers)
}

// Create makes a sandbox and returns once it is ready for commands.
func (c *Client) Create(ctx context.Context, o CreateOptions) (*Sandbox, error) {
	env := make([]string, 0, len(o.Env))
	for k, v := range o.Env {
		env = append(env, k+"="+v)
	}
	resp, err := c.svc.Create(ctx, connect.NewRequest(&corralv1.CreateRequest{
		Backend: o.Backend,
		Image:   o.Image,
		Resources: &corralv1.Resources{
			CpuMillis: o.Resources.CPUMillis, MemoryBytes: o.Resources.MemoryBytes,
			DiskBytes: o.Resources.DiskBytes, Pids: o.Resources.Pids,
			BestEffort: o.Resources.BestEffort,
			Io:         o.Resources.IO.toProto(),
		},
		Env: env, Workdir: o.Workdir, User: o.User, Labels: o.Labels,
		IdleTimeout: optionalDuration(o.IdleTimeout),
		MaxLifetime: optionalDuration(o.MaxLifetime),
		Network:     o.Network.toProto(),
		Placement:   o.Placement.toProto(),
		IdleAction:  o.IdleAction,
		Fresh:       o.Fresh,
	}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return &Sandbox{c: c, id: resp.Msg.Sandbox.Id}, nil
}

// Sandbox returns a handle on an existing sandbox without a call.
func (c *Client) Sandbox(id string) *Sandbox { return &Sandbox{c: c, id: id} }

// Get describes a sandbox.
func (c *Client) Get(ctx context.Context, id string) (*Info, error) {
	resp, err := c.svc.Get(ctx, connect.NewRequest(&corralv1.GetRequest{Id: id}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return infoFromProto(resp.Msg.Sandbox), nil
}

// ListOptions filter List.
type ListOptions struct {
	Labels   map[string]string
	State    State // empty: any
	PageSize int   // per request; List fetches every page
}

// List returns every sandbox matching the filter, oldest first (in a
// cluster, of the nodes that answered: ListCluster says which did not).
func (c *Client) List(ctx context.Context, o ListOptions) ([]*Info, error) {
	l, err := c.ListCluster(ctx, o)
	if err != nil {
		return nil, err
	}
	return l.Sandboxes, nil
}

// Delete removes a sandbox by id; it succeeds if the sandbox is already gone.
// (With a project token the server answers NotFound for a sandbox that is
// gone or not the project's, so as not to reveal which; both are "gone".)
func (c *Client) Delete(ctx context.Context, id string) error {
	_, err := c.svc.Delete(ctx, connect.NewRequest(&corralv1.DeleteRequest{Id: id}))
	if err = wrapErr(err); IsNotFound(err) {
		return nil
	}
	return err
}

// ID is the sandbox id.
func (s *Sandbox) ID() string { return s.id }

// Info describes the sandbox.
func (s *Sandbox) Info(ctx context.Context) (*Info, error) { return s.c.Get(ctx, s.id) }

// Delete removes the sandbox; it succeeds if the sandbox is already gone.
func (s *Sandbox) Delete(ctx context.Context) error { return s.c.Delete(ctx, s.id) }

// Pause freezes every process in the sandbox. Any later command or file
// operation resumes it.
func (s *Sandbox) Pause(ctx context.Context) error {
	_, err := s.c.svc.Pause(ctx, connect.NewRequest(&corralv1.PauseRequest{Id: s.id}))
	return wrapErr(err)
}

// Resume thaws a paused sandbox.
func (s *Sandbox) Resume(ctx context.Context) error {
	_, err := s.c.svc.Resume(ctx, connect.NewRequest(&corralv1.ResumeRequest{Id: s.id}))
	return wrapErr(err)
}

// Command is one program to run in a sandbox.
type Command struct {
	// Args is the program and its arguments, run without a shell.
	Args []string
	// Shell, when set instead of Args, is run with "sh -c".
	Shell   string
	Env     map[string]string
	Dir     string
	User    string
	Stdin   []byte
	Timeout time.Duration // 0: server default
	// OutputLimit caps stdout+stderr bytes; 0: server default.
	OutputLimit int64
	// Stdout and Stderr receive output as it arrives (Exec only).
	Stdout io.Writer
	Stderr io.Writer
	// StdinReader, when set instead of Stdin, is streamed to the command
	// until EOF, with no size cap (over HTTP/2). Reading stops when the
	// command ends.
	StdinReader io.Reader

	// IdempotencyKey names the command in the sandbox's exec log: the
	// command runs once, to its end even if the caller goes away, and a
	// repeat of the key returns the recorded result and output (or
	// attaches to it while it runs) instead of running it again.
	IdempotencyKey string
	// Step, when set instead of IdempotencyKey, derives the key from the
	// sandbox and this name (ExecKey).
	Step string
	// Idempotent derives the key from the sandbox and the number of
	// Idempotent commands this handle sent before, so a restarted trainer
	// that sends the same commands in the same order on a new handle
	// (Client.Sandbox(id)) gets the recorded results.
	Idempotent bool
}

// Result is how a command ended.
type Result struct {
	ExitCode  int // -1 when killed by a signal
	Signal    int
	TimedOut  bool
	OOMKilled bool
	Truncated bool // output passed the limit and was cut
	Duration  time.Duration
	// Stdout and Stderr hold the output for Run (nil for Exec).
	Stdout []byte
	Stderr []byte
	// ExecSeq is the command's number in the sandbox's exec log (0: it
	// carried no idempotency key).
	ExecSeq uint64
	// Replayed: the command did not run for this call; the result is the
	// recorded one of an earlier call with the same key (or of the run
	// this call attached to).
	Replayed bool
	// ReplayOutputTruncated: a replay's output is only the part the exec
	// log kept (its first MiB).
	ReplayOutputTruncated bool
}

func (cmd Command) request(s *Sandbox) *corralv1.ExecRequest {
	req := &corralv1.ExecRequest{
		SandboxId: s.id, Argv: cmd.Args, Cwd: cmd.Dir, User: cmd.User,
		Stdin: cmd.Stdin, OutputLimitBytes: cmd.OutputLimit,
		IdempotencyKey: cmd.key(s),
	}
	if cmd.Shell != "" {
		req.Argv, req.Shell = []string{cmd.Shell}, true
	}
	for k, v := range cmd.Env {
		req.Env = append(req.Env, k+"="+v)
	}
	if cmd.Timeout != 0 {
		req.Timeout = durationpb.New(cmd.Timeout)
	}
	return req
}

func resultFromProto(p *corralv1.ExecResult) *Result {
	return &Result{
		ExitCode: int(p.ExitCode), Signal: int(p.Signal), TimedOut: p.TimedOut,
		OOMKilled: p.OomKilled, Truncated: p.Truncated, Duration: p.Duration.AsDuration(),
		ExecSeq: p.ExecSeq, Replayed: p.Replayed, ReplayOutputTruncated: p.ReplayOutputTruncated,
	}
}

// Run runs a command and returns its whole output.
func (s *Sandbox) Run(ctx context.Context, cmd Command) (*Result, error) {
	if cmd.StdinReader != nil {
		return s.execStream(ctx, cmd, true)
	}
	resp, err := s.c.svc.Run(ctx, connect.NewRequest(cmd.request(s)))
	if err != nil {
		return nil, wrapErr(err)
	}
	res := resultFromProto(resp.Msg.Result)
	res.Stdout, res.Stderr = resp.Msg.Stdout, resp.Msg.Stderr
	return res, nil
}

// Exec runs a command, streaming its output to cmd.Stdout and cmd.Stderr
// (either may be nil to discard). Cancelling ctx kills the command.
func (s *Sandbox) Exec(ctx context.Context, cmd Command) (*Result, error) {
	if cmd.StdinReader != nil {
		return s.execStream(ctx, cmd, false)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.c.svc.Exec(ctx, connect.NewRequest(cmd.request(s)))
	if err != nil {
		return nil, wrapErr(err)
	}
	defer stream.Close()
	var res *Result
	for stream.Receive() {
		switch ev := stream.Msg().Event.(type) {
		case *corralv1.ExecResponse_Stdout:
			err = write(cmd.Stdout, ev.Stdout)
		case *corralv1.ExecResponse_Stderr:
			err = write(cmd.Stderr, ev.Stderr)
		case *corralv1.ExecResponse_Result:
			res = resultFromProto(ev.Result)
		}
		if err != nil {
			return nil, err
		}
	}
	if err := stream.Err(); err != nil {
		return nil, wrapErr(err)
	}
	if res == nil {
		return nil, &Error{Code: CodeInternal, Message: "exec stream ended without a result"}
	}
	return res, nil
}

func write(w io.Writer, p []byte) error {
	if w == nil {
		return nil
	}
	_, err := w.Write(p)
	return err
}

// toProto is nil when no limit is set (the node's apply).
func (l IOLimits) toProto() *corralv1.IOLimits {
	if l == (IOLimits{}) {
		return nil
	}
	return &corralv1.IOLimits{ReadBps: l.ReadBytesPerSec, WriteBps: l.WriteBytesPerSec, ReadIops: l.ReadOpsPerSec, WriteIops: l.WriteOpsPerSec}
}
