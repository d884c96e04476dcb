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
