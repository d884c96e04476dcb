package node

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/metrics"
	"github.com/corral-dev/corral/internal/state"
)

func (n *Node) describe(e *entry) *Sandbox {
	s := &Sandbox{
		Record:       *e.snapshot(),
		NodeID:       n.id,
		LastActiveAt: time.Unix(0, e.lastActive.Load()),
	}
	s.Degraded = n.degradedReason(s)
	if f := e.fence.Load(); f != nil {
		s.MigratingTo = f.target
	}
	return s
}

// Get describes one sandbox. It does not count as activity.
func (n *Node) Get(_ context.Context, id string) (*Sandbox, error) {
	e, err := n.lookupAny(id)
	if err != nil {
		return nil, err
	}
	return n.describe(e), nil
}

// ListFilter selects sandboxes for List.
type ListFilter struct {
	Labels    map[string]string
	Phase     state.Phase // empty: any
	PageSize  int
	PageToken string

	// Visible, when set, keeps only sandboxes of projects it accepts.
	Visible func(project string) bool
}

const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// List returns sandboxes oldest first, a page at a time.
func (n *Node) List(_ context.Context, f ListFilter) ([]*Sandbox, string, error) {
	if f.PageSize < 0 || f.PageSize > maxPageSize {
		return nil, "", errdefs.InvalidArgument("page_size: %d is out of range (allowed 0 to %d)", f.PageSize, maxPageSize)
	}
	size := or(f.PageSize, defaultPageSize)
	after, err := decodePageToken(f.PageToken)
	if err != nil {
		return nil, "", err
	}
	n.mu.Lock()
	all := make([]*Sandbox, 0, len(n.sandboxes))
	for _, e := range n.sandboxes {
		all = append(all, n.describe(e))
	}
	n.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return pageKey(all[i]) < pageKey(all[j]) })
	var page []*Sandbox
	for _, sb := range all {
		if pageKey(sb) <= after || !matches(sb, f) {
			continue
		}
		if len(page) == size {
			return page, encodePageToken(pageKey(page[len(page)-1])), nil
		}
		page = append(page, sb)
	}
	return page, "", nil
}

func matches(sb *Sandbox, f ListFilter) bool {
	if f.Phase != "" && sb.Phase != f.Phase {
		return false
	}
	if f.Visible != nil && !f.Visible(sb.Project) {
		return false
	}
	for k, v := range f.Labels {
		if got, ok := sb.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// pageKey orders sandboxes by creation time, then id; it is what a page
// token carries.
func pageKey(sb *Sandbox) string {
	return fmt.Sprintf("%020d/%s", sb.CreatedAt.UnixNano(), sb.ID)
}

func encodePageToken(key string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(key))
}

func decodePageToken(tok string) (string, error) {
	if tok == "" {
		return "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	nanos, _, ok := strings.Cut(string(raw), "/")
	if _, perr := strconv.ParseInt(nanos, 10, 64); err != nil || !ok || perr != nil {
		return "", errdefs.InvalidArgument("page_token: %q is not a token from a previous List", truncate(tok))
	}
	return string(raw), nil
}

// Delete stops and removes a sandbox. Deleting an unknown sandbox of this
// node succeeds with existed=false. It answers once the sandbox's processes
// are dead and its record says deleting; the rest of the teardown (writable
// layer, run dir, id range, record) runs in the background (teardown), and
// a restart finishes what a crash interrupted. On a recycling node a
// recyclable sandbox is scrubbed instead of stopped, and renewed and pooled
// for its project in the background (warm.go).
func (n *Node) Delete(ctx context.Context, id string) (existed bool, err error) {
	e, err := n.lookupAny(id)
	if errdefs.IsNotFound(err) {
		return false, n.checkID(id)
	}
	if err != nil {
		return false, err
	}
	e.mu.Lock()
	if e.deleting {
		e.mu.Unlock()
		return true, nil
	}
	// A fenced sandbox goes only once its migration switched (HoldFence).
	f := e.fence.Load()
	if f != nil && !f.held {
		e.mu.Unlock()
		return true, f.refusal(id)
	}
	e.deleting = true
	sb, rec := e.sb, e.snapshotLocked()
	packing, cancelPack := e.packing, e.packCancel
	e.mu.Unlock()
	start := time.Now()
	if cancelPack != nil { // a pack reads the writable layer Cleanup removes
		cancelPack()
		<-packing
	}
	recycle := sb != nil && f == nil && n.warm.mayRecycle(rec, sb)
	if recycle {
		if err := sb.(backend.Recycler).Scrub(ctx); err != nil {
			n.log.Warn("delete sandbox: scrub for recycling failed; stopping it", "sandbox", id, "err", err)
			n.cfg.Metrics.CountRecycle("torn_down")
			recycle = false
		}
	}
	if sb != nil && !recycle {
		if err := sb.Stop(ctx); err != nil {
			e.mu.Lock()
			e.deleting = false
			e.mu.Unlock()
			return true, fmt.Errorf("delete sandbox %s: %w", id, err)
		}
	}
	stopped := time.Since(start)
	rec.Deleting = true
	if err := n.db.Put(rec); err != nil {
		// The sandbox is dead either way: a restart finds it lost and
		// cleans it up as such.
		n.log.Error("mark sandbox record deleting", "sandbox", id, "err", err)
	}
	n.mu.Lock()
	delete(n.sandboxes, id)
	n.mu.Unlock()
	if e.recyclable && !recycle { // a recycled one counts until it is pooled
		n.warm.unclaim(rec.Image)
	}
	e.markDeleted()
	if f != nil {
		n.removeFenceMark(id)
	}
	done := n.startTeardown(id)
	go func() {
		defer n.endTeardown(id, done)
		if recycle && n.warm.renewAndPool(rec, sb) {
			return
		}
		n.teardown(e.backend, rec, start, stopped)
	}()
	n.cfg.Metrics.ObserveOp(rec.Backend, metrics.OpDelete, stopped)
	n.emit(rec, events.Deleted, "", nil)
	return true, nil
}

// teardownRetries are the waits between attempts of a background teardown
// that failed (a disk still busy); after the last, the record stays marked
// deleting and the next start retries.
var teardownRetries = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}

// teardown removes what a deleted sandbox's processes left: the backend's
// resources, then the record, exec log and image pins.
func (n *Node) teardown(b backend.Backend, rec *state.Record, start time.Time, stopped time.Duration) {
	id := rec.ID
	began := time.Now()
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := b.Cleanup(ctx, rec.BackendName(), rec.BackendRecord)
		cancel()
		if err == nil {
			break
		}
		if i == len(teardownRetries) {
			n.log.Error("delete sandbox: teardown failed; the next start retries", "sandbox", id, "err", err)
			return
		}
		n.log.Warn("delete sandbox: teardown failed; retrying", "sandbox", id, "err", err, "in", teardownRetries[i])
		select {
		case <-time.After(teardownRetries[i]):
		case <-n.closing: // the record stays marked deleting: the next start retries
			return
		}
	}
	n.forget(rec)
	n.log.Debug("sandbox deleted", "sandbox", id, "project", projectOf(rec), "stop", stopped, "teardown", time.Since(began), "total", time.Since(start))
}

// startTeardown records that id's teardown is in flight (for Settle);
// endTeardown, with the channel it returned, says it is over.
func (n *Node) startTeardown(id string) chan struct{} {
	done := make(chan struct{})
	n.teardownMu.Lock()
	defer n.teardownMu.Unlock()
	if n.inTeardown == nil {
		n.inTeardown = map[string]chan struct{}{}
	}
	n.inTeardown[id] = done
	return done
}

func (n *Node) endTeardown(id string, done chan struct{}) {
	n.teardownMu.Lock()
	defer n.teardownMu.Unlock()
	if n.inTeardown[id] == done {
		delete(n.inTeardown, id)
	}
	close(done)
}

// Settle waits until the teardowns of the sandboxes deleted before it was
// called are over, or ctx ends: a Delete answers before its sandbox's image
// pins and writable layer are released, and a caller that removes an image
// right after deleting its last sandbox must not find it still in use.
func (n *Node) Settle(ctx context.Context) error {
	n.teardownMu.Lock()
	waits := make([]chan struct{}, 0, len(n.inTeardown))
	for _, done := range n.inTeardown {
		waits = append(waits, done)
	}
	n.teardownMu.Unlock()
	for _, done := range waits {
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// forget drops a torn-down sandbox's record, exec log and image pins.
func (n *Node) forget(rec *state.Record) {
	if err := n.db.Delete(rec.ID); err != nil {
		n.log.Error("delete sandbox record", "sandbox", rec.ID, "err", err)
	}
	if err := n.execLog.Drop(rec.ID); err != nil {
		n.log.Error("drop exec log", "sandbox", rec.ID, "err", err)
	}
	n.cfg.Images.Release(rec.ID)
}

// ExecRequest is one command; zero fields take the sandbox's or node's defaults.
type ExecRequest struct {
	Argv  []string
	Shell bool
	Env   []string
	Cwd   string
	User  string
	Stdin []byte
	// StdinReader, when set instead of Stdin, streams stdin until EOF
	// (no cap: the caller's stream bounds it).
	StdinReader io.Reader
	Timeout     time.Duration
	OutputLimit int64
	// IdempotencyKey is only for ExecKeyed (see there).
	IdempotencyKey string
}

// Exec runs a command in a sandbox, streaming output to out.
func (n *Node) Exec(ctx context.Context, id string, req ExecRequest, out backend.OutputFunc) (backend.ExecResult, error) {
	e, sb, err := n.acquire(ctx, id)
	if err != nil {
		return backend.ExecResult{}, err
	}
	defer e.release()
	rec := e.snapshot()
	spec, err := n.execSpec(rec, req)
	if err != nil {
		return backend.ExecResult{}, err
	}
	start := time.Now()
	res, err := sb.Exec(ctx, spec, out)
	n.cfg.Metrics.ObserveOp(rec.Backend, metrics.OpExec, time.Since(start))
	if err == nil {
		n.noteExec(ctx, e, spec.Argv, start, res)
	}
	return res, err
}

func (n *Node) execSpec(rec *state.Record, req ExecRequest) (backend.ExecSpec, error) {
	d, l := n.cfg.Defaults, n.cfg.Limits
	argv := req.Argv
	switch {
	case len(argv) == 0 || argv[0] == "":
		return backend.ExecSpec{}, errdefs.InvalidArgument("argv: must name a program (argv[0] is empty)")
	case req.Shell && len(argv) != 1:
		return backend.ExecSpec{}, errdefs.InvalidArgument("argv: with shell=true, argv must be one script (got %d elements)", len(argv))
	case req.Shell:
		argv = []string{"/bin/sh", "-c", argv[0]}
	}
	if len(argv) > maxArgs {
		return backend.ExecSpec{}, errdefs.InvalidArgument("argv: %d arguments is over the limit of %d", len(argv), maxArgs)
	}
	total := 0
	for i, a := range argv {
		total += len(a)
		if strings.ContainsRune(a, 0) {
			return backend.ExecSpec{}, errdefs.InvalidArgument("argv[%d]: contains a NUL byte", i)
		}
	}
	if int64(total) > maxArgvBytes {
		return backend.ExecSpec{}, errdefs.InvalidArgument("argv: %d bytes is over the limit of %d", total, maxArgvBytes)
	}
	if int64(len(req.Stdin)) > maxStdinBytes {
		return backend.ExecSpec{}, errdefs.InvalidArgument("stdin: %d bytes is over the limit of %d", len(req.Stdin), maxStdinBytes)
	}
	timeout := or(req.Timeout, d.ExecTimeout)
	limit := or(req.OutputLimit, d.OutputLimit)
	checks := []error{
		checkEnv("env", req.Env),
		checkAbsPath("cwd", req.Cwd),
		checkUser("user", req.User),
		checkDuration("timeout", timeout, l.MaxExecTimeout),
		checkRange("output_limit_bytes", limit, 1, l.MaxOutputLimit, ""),
	}
	for _, err := range checks {
		if err != nil {
			return backend.ExecSpec{}, err
		}
	}
	return backend.ExecSpec{
		Argv:  argv,
		Shell: req.Shell,
		Env:   mergeEnv(rec.Env, req.Env),
		Cwd:   or(req.Cwd, or(rec.Workdir, "/")),
		// uid 0 needs no /etc/passwd lookup, so an agent that clobbers that
		// file cannot break the node's next exec.
		User:        or(req.User, or(rec.User, "0:0")),
		Stdin:       req.Stdin,
		StdinReader: req.StdinReader,
		Timeout:     timeout,
		OutputLimit: limit,
	}, nil
}

// Pause freezes a sandbox's processes.
func (n *Node) Pause(ctx context.Context, id string) error {
	return n.setPaused(ctx, id, true)
}

// Resume thaws a paused sandbox; resuming a running one is a no-op.
func (n *Node) Resume(ctx context.Context, id string) error {
	return n.setPaused(ctx, id, false)
}

func (n *Node) setPaused(ctx context.Context, id string, pause bool) error {
	e, err := n.lookup(id)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if f := e.fence.Load(); f != nil {
		return f.refusal(id)
	}
	e.touch()
	start := time.Now()
	switch {
	case e.deleting:
		return errdefs.NotFound("sandbox %s is being deleted", id)
	case e.rec.Phase == state.PhaseStopped:
		return errdefs.FailedPrecondition("sandbox %s is stopped (%s)", id, e.rec.StopReason)
	case pause && e.rec.Phase != state.PhasePaused:
		if err := e.sb.Pause(ctx); err != nil {
			return fmt.Errorf("pause sandbox %s: %w", id, err)
		}
		e.rec.Phase = state.PhasePaused
		n.cfg.Metrics.ObserveOp(e.rec.Backend, metrics.OpPause, time.Since(start))
		rec := e.snapshotLocked()
		n.emit(rec, events.Paused, "", nil)
		n.noteCheckpoint(rec, e, e.sb)
	case !pause && e.rec.Phase == state.PhasePaused:
		if err := e.sb.Resume(ctx); err != nil {
			return fmt.Errorf("resume sandbox %s: %w", id, err)
		}
		e.rec.Phase = state.PhaseRunning
		e.rec.Reclaimed, e.rec.ReclaimedResident = false, 0
		n.cfg.Metrics.ObserveOp(e.rec.Backend, metrics.OpResume, time.Since(start))
		n.emit(e.snapshotLocked(), events.Resumed, "", nil)
	default:
		return nil
	}
	n.putLocked(e)
	return nil
}
