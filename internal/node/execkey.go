package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/execlog"
	"github.com/corral-dev/corral/internal/metrics"
)

const (
	// maxIdempotencyKey bounds a key's bytes.
	maxIdempotencyKey = 256
	// execLogKeep is how much of a command's output the exec log keeps
	// for replays; the live caller still gets all of it.
	execLogKeep = 1 << 20
	// maxLoggedExecs bounds one sandbox's exec log.
	maxLoggedExecs = 100_000
)

// ExecLogPath is where the exec log of the node with data dir dataDir lives.
func ExecLogPath(dataDir string) string { return filepath.Join(dataDir, "execlog.db") }

// KeyedExec says what became of an exec that carried an idempotency key.
type KeyedExec struct {
	// Seq is the command's number in the sandbox's exec log.
	Seq uint64
	// Replayed: this call did not start the command (it returned a
	// recorded result or attached to the running command).
	Replayed bool
	// OutputTruncated: a replay's output is only the part the log kept.
	OutputTruncated bool
}

// keyedRun is a keyed command while it runs: its output so far (bounded
// by the command's output limit) for every caller attached to it.
type keyedRun struct {
	seq    uint64
	digest string

	mu     sync.Mutex
	chunks []execlog.Chunk
	grew   chan struct{} // closed and replaced on every chunk
	done   chan struct{}
	res    backend.ExecResult
	err    error
}

func (r *keyedRun) add(stream backend.Stream, p []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.chunks = append(r.chunks, execlog.Chunk{Stream: int(stream), Data: append([]byte(nil), p...)})
	close(r.grew)
	r.grew = make(chan struct{})
	return nil
}

// keyedExecs are the node's running keyed commands, by sandbox and key.
type keyedExecs struct {
	mu   sync.Mutex
	runs map[string]*keyedRun
}

func keyedName(id, key string) string { return id + "\x00" + key }

// ExecKeyed is Exec with an idempotency key (req.IdempotencyKey): the
// first call runs the command to its end whether or not the caller stays;
// a repeated key returns the recorded result and output, or attaches to
// the command while it runs, and never runs it again.
func (n *Node) ExecKeyed(ctx context.Context, id string, req ExecRequest, out backend.OutputFunc) (backend.ExecResult, KeyedExec, error) {
	key := req.IdempotencyKey
	switch {
	case len(key) > maxIdempotencyKey:
		return backend.ExecResult{}, KeyedExec{}, errdefs.InvalidArgument("idempotency_key: %d bytes is over the limit of %d", len(key), maxIdempotencyKey)
	case req.StdinReader != nil:
		return backend.ExecResult{}, KeyedExec{}, errdefs.InvalidArgument("idempotency_key: not allowed with streamed stdin (a repeat could not be compared); send stdin in the request")
	}
	e, sb, err := n.acquire(ctx, id)
	if err != nil {
		return backend.ExecResult{}, KeyedExec{}, err
	}
	rec := e.snapshot()
	spec, err := n.execSpec(rec, req)
	if err != nil {
		e.release()
		return backend.ExecResult{}, KeyedExec{}, err
	}
	digest := requestDigest(spec)
	name := keyedName(id, key)
	n.keyed.mu.Lock()
	if run, ok := n.keyed.runs[name]; ok {
		n.keyed.mu.Unlock()
		e.release()
		if run.digest != digest {
			return backend.ExecResult{}, KeyedExec{}, reusedKey(key, run.seq)
		}
		return attach(ctx, run, out, true)
	}
	ent, found, err := n.execLog.Begin(id, execlog.Entry{
		Key: key, Argv: req.Argv, Shell: req.Shell, Digest: digest, StartedAt: time.Now(),
	}, maxLoggedExecs)
	if err != nil || found {
		n.keyed.mu.Unlock()
		e.release()
		if err != nil {
			return backend.ExecResult{}, KeyedExec{}, err
		}
		return n.replay(id, ent, digest, out)
	}
	run := &keyedRun{seq: ent.Seq, digest: digest, grew: make(chan struct{}), done: make(chan struct{})}
	if n.keyed.runs == nil {
		n.keyed.runs = map[string]*keyedRun{}
	}
	n.keyed.runs[name] = run
	n.keyed.mu.Unlock()
	// The command outlives the call: a trainer killed mid-command finds its
	// result under the same key when it comes back.
	go func() {
		defer e.release()
		start := time.Now()
		res, err := sb.Exec(context.WithoutCancel(ctx), spec, run.add)
		n.cfg.Metrics.ObserveOp(rec.Backend, metrics.OpExec, time.Since(start))
		if err == nil {
			n.noteExec(context.WithoutCancel(ctx), e, spec.Argv, start, res)
		}
		n.finishKeyed(id, ent, run, res, err)
		n.keyed.mu.Lock()
		delete(n.keyed.runs, name)
		n.keyed.mu.Unlock()
	}()
	return attach(ctx, run, out, false)
}

// finishKeyed records a keyed command's end in the log, then wakes its callers.
func (n *Node) finishKeyed(id string, ent execlog.Entry, run *keyedRun, res backend.ExecResult, err error) {
	run.mu.Lock()
	chunks := run.chunks
	run.mu.Unlock()
	var kept []execlog.Chunk
	for _, c := range chunks {
		ent.OutputBytes += int64(len(c.Data))
		if room := execLogKeep - ent.OutputKeptBytes; room > 0 {
			d := c.Data[:min(int64(len(c.Data)), room)]
			kept = append(kept, execlog.Chunk{Stream: c.Stream, Data: d})
			ent.OutputKeptBytes += int64(len(d))
		}
	}
	ent.EndedAt = time.Now()
	if err != nil {
		ent.State, ent.Error, ent.ErrorClass = execlog.Failed, err.Error(), classOf(err)
	} else {
		ent.State, ent.Result = execlog.Done, resultToLog(res)
	}
	if lerr := n.execLog.Finish(id, ent, kept); lerr != nil {
		n.log.Error("record keyed exec", "sandbox", id, "seq", ent.Seq, "err", lerr)
	}
	run.mu.Lock()
	run.res, run.err = res, err
	close(run.done)
	run.mu.Unlock()
}

// attach streams a running keyed command's output from its start and
// returns its result. Leaving (ctx ends) does not stop the command.
func attach(ctx context.Context, run *keyedRun, out backend.OutputFunc, replayed bool) (backend.ExecResult, KeyedExec, error) {
	info := KeyedExec{Seq: run.seq, Replayed: replayed}
	send := func(chunks []execlog.Chunk) error {
		for _, c := range chunks {
			if err := out(backend.Stream(c.Stream), c.Data); err != nil {
				return err
			}
		}
		return nil
	}
	for next := 0; ; {
		run.mu.Lock()
		chunks, grew, done := run.chunks[next:], run.grew, run.done
		run.mu.Unlock()
		if err := send(chunks); err != nil {
			return backend.ExecResult{}, info, err
		}
		next += len(chunks)
		select {
		case <-grew:
			continue
		case <-done:
		case <-ctx.Done():
			return backend.ExecResult{}, info, fmt.Errorf("exec seq %d (it keeps running): %w", run.seq, ctx.Err())
		}
		run.mu.Lock()
		rest, res, err := run.chunks[next:], run.res, run.err
		run.mu.Unlock()
		if err := send(rest); err != nil {
			return backend.ExecResult{}, info, err
		}
		return res, info, err
	}
}

// replay answers a repeated key from the log.
func (n *Node) replay(id string, ent execlog.Entry, digest string, out backend.OutputFunc) (backend.ExecResult, KeyedExec, error) {
	info := KeyedExec{Seq: ent.Seq, Replayed: true, OutputTruncated: ent.OutputKeptBytes < ent.OutputBytes}
	if ent.Digest != digest {
		return backend.ExecResult{}, info, reusedKey(ent.Key, ent.Seq)
	}
	switch ent.State {
	case execlog.Lost, execlog.Failed:
		return backend.ExecResult{}, info, errorOf(ent.ErrorClass, fmt.Sprintf("exec %q (seq %d, not run again): %s", ent.Key, ent.Seq, ent.Error))
	case execlog.Running:
		// Begin found it running but no run is registered: only the
		// instant between its finish and the map update; the log has it.
		return backend.ExecResult{}, info, errdefs.Unavailable("exec %q (seq %d) is finishing; retry", ent.Key, ent.Seq)
	}
	chunks, err := n.execLog.Output(id, ent.Seq)
	if err != nil {
		return backend.ExecResult{}, info, err
	}
	for _, c := range chunks {
		if err := out(backend.Stream(c.Stream), c.Data); err != nil {
			return backend.ExecResult{}, info, err
		}
	}
	r := ent.Result
	return backend.ExecResult{ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut, OOMKilled: r.OOMKilled, Truncated: r.Truncated, Duration: r.Duration}, info, nil
}

// ListExecs returns sandbox id's logged commands above since, oldest
// first, and the since of the next page (0: none).
func (n *Node) ListExecs(_ context.Context, id string, since uint64, pageSize int) ([]execlog.Entry, uint64, error) {
	if pageSize < 0 || pageSize > maxPageSize {
		return nil, 0, errdefs.InvalidArgument("page_size: %d is out of range (allowed 0 to %d)", pageSize, maxPageSize)
	}
	if _, err := n.lookup(id); err != nil {
		return nil, 0, err
	}
	ents, more, err := n.execLog.Since(id, since, or(pageSize, defaultPageSize))
	if err != nil || !more {
		return ents, 0, err
	}
	return ents, ents[len(ents)-1].Seq, nil
}

// recoverExecLog runs after recover: logs of sandboxes without a record
// are dropped (a record kept for a backend this node no longer runs keeps
// its log), commands the previous daemon ran are marked lost.
func (n *Node) recoverExecLog() error {
	recs, err := n.db.All()
	if err != nil {
		return err
	}
	known := make(map[string]bool, len(recs))
	for _, rec := range recs {
		known[rec.ID] = true
	}
	dropped, lost, err := n.execLog.Recover(func(id string) bool { return known[id] }, time.Now())
	if err != nil {
		return err
	}
	if dropped+lost > 0 {
		n.log.Info("exec log recovered", "logs_dropped", dropped, "execs_lost", lost)
	}
	return nil
}

func reusedKey(key string, seq uint64) error {
	return errdefs.InvalidArgument("idempotency_key: %q was used for a different command (seq %d); a key names one command", key, seq)
}

// requestDigest identifies what an exec runs, so a reused key is caught.
func requestDigest(s backend.ExecSpec) string {
	b, _ := json.Marshal(struct {
		Argv        []string
		Env         []string
		Cwd, User   string
		Stdin       []byte
		Timeout     time.Duration
		OutputLimit int64
	}{s.Argv, s.Env, s.Cwd, s.User, s.Stdin, s.Timeout, s.OutputLimit})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func resultToLog(r backend.ExecResult) execlog.Result {
	return execlog.Result{ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut, OOMKilled: r.OOMKilled, Truncated: r.Truncated, Duration: r.Duration}
}

// errorClasses name errdefs classes in the log, so a replayed failure
// keeps its class.
var errorClasses = []struct {
	name  string
	class error
	make  func(string, ...any) error
}{
	{"invalid_argument", errdefs.ErrInvalidArgument, errdefs.InvalidArgument},
	{"not_found", errdefs.ErrNotFound, errdefs.NotFound},
	{"failed_precondition", errdefs.ErrFailedPrecondition, errdefs.FailedPrecondition},
	{"resource_exhausted", errdefs.ErrResourceExhausted, errdefs.ResourceExhausted},
	{"unavailable", errdefs.ErrUnavailable, errdefs.Unavailable},
	{"not_supported", errdefs.ErrNotSupported, errdefs.NotSupported},
}

func classOf(err error) string {
	for _, c := range errorClasses {
		if errors.Is(err, c.class) {
			return c.name
		}
	}
	return ""
}

func errorOf(class, msg string) error {
	for _, c := range errorClasses {
		if c.name == class {
			return c.make("%s", msg)
		}
	}
	return errors.New(msg)
}
