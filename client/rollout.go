package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// ExecKey derives the idempotency key of step in a sandbox: the same
// sandbox and step always give the same key, different ones never collide.
func ExecKey(sandboxID, step string) string {
	sum := sha256.Sum256([]byte(sandboxID + "\x00" + step))
	return "step-" + hex.EncodeToString(sum[:16])
}

// key is the idempotency key cmd carries ("" none).
func (cmd Command) key(s *Sandbox) string {
	switch {
	case cmd.IdempotencyKey != "":
		return cmd.IdempotencyKey
	case cmd.Step != "":
		return ExecKey(s.id, cmd.Step)
	case cmd.Idempotent:
		return ExecKey(s.id, "#"+strconv.FormatUint(s.steps.Add(1)-1, 10))
	}
	return ""
}

// ExecState is where a logged command is.
type ExecState string

const (
	ExecRunning ExecState = "running"
	ExecDone    ExecState = "done"
	// ExecFailed: the node could not run it to its end (Error says why).
	ExecFailed ExecState = "failed"
	// ExecLost: the node restarted while it ran; its outcome is unknown,
	// and a repeat of its key fails rather than run it again.
	ExecLost ExecState = "lost"
)

var execStateFromProto = map[corralv1.ExecState]ExecState{
	corralv1.ExecState_EXEC_STATE_RUNNING: ExecRunning,
	corralv1.ExecState_EXEC_STATE_DONE:    ExecDone,
	corralv1.ExecState_EXEC_STATE_FAILED:  ExecFailed,
	corralv1.ExecState_EXEC_STATE_LOST:    ExecLost,
}

// ExecLogEntry is one command of a sandbox's exec log.
type ExecLogEntry struct {
	Seq            uint64
	IdempotencyKey string
	Args           []string // the script alone when Shell
	Shell          bool
	State          ExecState
	// Result is set when State is ExecDone (without output: repeat the
	// key to get it).
	Result    *Result
	Error     string
	StartedAt time.Time
	EndedAt   time.Time // zero while running
	// OutputBytes the command produced; OutputKeptBytes of them the log kept.
	OutputBytes, OutputKeptBytes int64
}

// ListExecs returns the sandbox's logged commands (those that carried an
// idempotency key) numbered above sinceSeq, oldest first: what a
// restarted trainer needs to fast-forward.
func (s *Sandbox) ListExecs(ctx context.Context, sinceSeq uint64) ([]ExecLogEntry, error) {
	var out []ExecLogEntry
	for {
		resp, err := s.c.roll.ListExecs(ctx, connect.NewRequest(&corralv1.ListExecsRequest{SandboxId: s.id, SinceSeq: sinceSeq, PageSize: 1000}))
		if err != nil {
			return nil, wrapErr(err)
		}
		for _, p := range resp.Msg.Entries {
			e := ExecLogEntry{
				Seq: p.Seq, IdempotencyKey: p.IdempotencyKey, Args: p.Argv, Shell: p.Shell,
				State: execStateFromProto[p.State], Error: p.Error,
				StartedAt: p.StartedAt.AsTime(), OutputBytes: p.OutputBytes, OutputKeptBytes: p.OutputKeptBytes,
			}
			if p.EndedAt != nil {
				e.EndedAt = p.EndedAt.AsTime()
			}
			if p.Result != nil {
				e.Result = resultFromProto(p.Result)
			}
			out = append(out, e)
		}
		if sinceSeq = resp.Msg.NextSeq; sinceSeq == 0 {
			return out, nil
		}
	}
}

// Memory is where a sandbox's memory is (Info.Memory).
type Memory struct {
	ResidentBytes int64 // in RAM
	SwappedBytes  int64 // in the node's swap area
	// Reclaimed: paused with Reclaim and not resumed since.
	Reclaimed bool
}

// Reclaimed is what Sandbox.Reclaim did.
type Reclaimed struct {
	ResidentBeforeBytes, ResidentAfterBytes, SwappedBytes int64
}

// Reclaim pauses the sandbox and pushes its memory out of RAM: a
// container's to the node's swap area (the server needs `corral serve
// --swap`; without it the call fails FailedPrecondition and the sandbox
// keeps running), a microVM's to a snapshot on disk. Any later command or
// file operation resumes it, and pages come back as they are touched.
func (s *Sandbox) Reclaim(ctx context.Context) (*Reclaimed, error) {
	resp, err := s.c.svc.Pause(ctx, connect.NewRequest(&corralv1.PauseRequest{Id: s.id, Reclaim: true}))
	if err != nil {
		return nil, wrapErr(err)
	}
	m := resp.Msg
	return &Reclaimed{ResidentBeforeBytes: m.ResidentBeforeBytes, ResidentAfterBytes: m.ResidentAfterBytes, SwappedBytes: m.SwappedBytes}, nil
}

// BulkResult is what PauseMany or ResumeMany did.
type BulkResult struct {
	// Done counts the sandboxes paused (or reclaimed) or resumed.
	Done int
	// ResidentBeforeBytes and ResidentAfterBytes sum the reclaimed
	// sandboxes' memory in RAM (PauseMany with reclaim).
	ResidentBeforeBytes, ResidentAfterBytes int64
	// Failures maps a sandbox id to why it failed; the others went on.
	Failures map[string]string
	// NodeFailures maps a node id to why it could not be asked (through a
	// cluster's control plane: a lost or unreachable node, whose
	// sandboxes were left as they were); the other nodes' went on.
	NodeFailures map[string]string
}

func failuresFromProto(f []*corralv1.SandboxFailure) map[string]string {
	out := map[string]string{}
	for _, x := range f {
		out[x.Id] = x.Error
	}
	return out
}

func nodeFailuresFromProto(f []*corralv1.NodeFailure) map[string]string {
	out := map[string]string{}
	for _, x := range f {
		out[x.NodeId] = x.Error
	}
	return out
}

// PauseMany pauses every running sandbox carrying all of labels (at least
// one label), and with reclaim pushes their memory out as Reclaim does.
func (c *Client) PauseMany(ctx context.Context, labels map[string]string, reclaim bool) (*BulkResult, error) {
	resp, err := c.roll.PauseMany(ctx, connect.NewRequest(&corralv1.PauseManyRequest{Labels: labels, Reclaim: reclaim}))
	if err != nil {
		return nil, wrapErr(err)
	}
	m := resp.Msg
	return &BulkResult{Done: int(m.Paused), ResidentBeforeBytes: m.ResidentBeforeBytes, ResidentAfterBytes: m.ResidentAfterBytes,
		Failures: failuresFromProto(m.Failures), NodeFailures: nodeFailuresFromProto(m.NodeFailures)}, nil
}

// ResumeMany resumes every paused sandbox carrying all of labels.
func (c *Client) ResumeMany(ctx context.Context, labels map[string]string) (*BulkResult, error) {
	resp, err := c.roll.ResumeMany(ctx, connect.NewRequest(&corralv1.ResumeManyRequest{Labels: labels}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return &BulkResult{Done: int(resp.Msg.Resumed), Failures: failuresFromProto(resp.Msg.Failures),
		NodeFailures: nodeFailuresFromProto(resp.Msg.NodeFailures)}, nil
}

// ForkResult is what Sandbox.Fork made.
type ForkResult struct {
	// Image is the composition every fork was created from (containers).
	Image string
	// Snapshot is the snapshot the forks were restored from (microVMs;
	// removed once they were made).
	Snapshot string
	// ProcessesCarried: the forks continue the parent's processes (false
	// for containers, which fork their files only).
	ProcessesCarried bool
	// Forks has one entry per fork asked for, in order.
	Forks []ForkOutcome
}

// ForkOutcome is one fork: its sandbox, or why it was not made.
type ForkOutcome struct {
	Sandbox *Sandbox
	Info    *Info
	Err     error
}

// Fork makes n new sandboxes starting from this one as it is now (its
// files for containers, the parent frozen while they are read; for
// microVMs one snapshot restored n times, processes and all), with
// its resources, settings and labels plus "corral.fork-of". Failures are
// per fork (e.g. the project's quota); a bad n fails the whole call.
func (s *Sandbox) Fork(ctx context.Context, n int) (*ForkResult, error) {
	resp, err := s.c.roll.Fork(ctx, connect.NewRequest(&corralv1.ForkRequest{SandboxId: s.id, Count: int32(n)}))
	if err != nil {
		return nil, wrapErr(err)
	}
	out := &ForkResult{Image: resp.Msg.Image, Snapshot: resp.Msg.SnapshotId, ProcessesCarried: resp.Msg.ProcessesCarried}
	for _, f := range resp.Msg.Forks {
		if f.Sandbox == nil {
			out.Forks = append(out.Forks, ForkOutcome{Err: &Error{Code: CodeInternal, Message: f.Error}})
			continue
		}
		out.Forks = append(out.Forks, ForkOutcome{Sandbox: s.c.Sandbox(f.Sandbox.Id), Info: infoFromProto(f.Sandbox)})
	}
	return out, nil
}
