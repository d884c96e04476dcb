package iam

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// AuditEntry is one management request in the audit log.
type AuditEntry struct {
	// Key orders entries (time, then a random suffix); it is the cursor
	// of a listing.
	Key       string    `json:"key"`
	Time      time.Time `json:"time"`
	NodeAdmin bool      `json:"node_admin,omitempty"`
	TokenID   string    `json:"token_id,omitempty"`
	// Project is the caller's project ("" for the node administrator).
	Project   string `json:"project,omitempty"`
	Procedure string `json:"procedure"`
	Summary   string `json:"summary,omitempty"`
	// Result is "ok" or the error's code and message.
	Result string `json:"result"`
}

const auditPrefix = "audit/"

// Record appends e to the audit log durably (synced to the journal, or the
// store's Txn, before it returns): callers record before they answer.
// Concurrent records share one write, so one sync serves them all.
func (s *Service) Record(ctx context.Context, p Principal, e AuditEntry) error {
	rec := s.newAuditWrite(p, e)
	if err := s.enqueueAudit(rec); err != nil {
		return err
	}
	return s.awaitAudit(rec)
}

// AuditBegun is an entry written while its call runs (see BeginRecord).
type AuditBegun struct {
	s   *Service
	rec auditWrite
	err error // the entry could not even be queued
}

// AuditStarted is the result of an entry whose call began and whose end is
// not recorded (BeginRecord's entry until Finish's rewrite is on disk).
const AuditStarted = "started"

// BeginRecord starts writing e, with Result "started", without waiting: for
// calls that take about as long as the store's sync (an exec), whose entry
// is thus synced while the call runs instead of after it. Finish must
// follow. Followers see the entry once, with its final result.
func (s *Service) BeginRecord(p Principal, e AuditEntry) *AuditBegun {
	e.Result = AuditStarted
	rec := s.newAuditWrite(p, e)
	rec.quiet = true
	return &AuditBegun{s: s, rec: rec, err: s.enqueueAudit(rec)}
}

// Finish waits until the begun entry is durable, then rewrites it with the
// call's result: a failure durably before Finish returns (the caller
// answers after it), a success without waiting, so a daemon killed just
// after answering leaves "started" — the call was made, its outcome not
// recorded — and never a result that did not happen.
func (b *AuditBegun) Finish(result string) error {
	if b.err != nil {
		return b.err
	}
	if err := b.s.awaitAudit(b.rec); err != nil {
		return err
	}
	e := b.rec.entry
	e.Result = result
	val, _ := json.Marshal(e)
	rec := auditWrite{entry: e, value: val, done: make(chan error, 1), rewrite: true, unawaited: result == "ok"}
	if err := b.s.enqueueAudit(rec); err != nil {
		return err
	}
	if result == "ok" {
		return nil
	}
	return b.s.awaitAudit(rec) // published by the writer
}

func (s *Service) newAuditWrite(p Principal, e AuditEntry) auditWrite {
	e.Time = s.now().UTC()
	e.NodeAdmin, e.TokenID, e.Project = p.NodeAdmin, p.TokenID, p.Project
	rnd := make([]byte, 4)
	_, _ = rand.Read(rnd)
	e.Key = fmt.Sprintf("%s%020d-%s", auditPrefix, e.Time.UnixNano(), hex.EncodeToString(rnd))
	val, _ := json.Marshal(e)
	return auditWrite{entry: e, value: val, done: make(chan error, 1)}
}

func (s *Service) enqueueAudit(rec auditWrite) error {
	select {
	case s.auditQ <- rec:
		return nil
	case <-s.stopAudit:
		return errdefs.Unavailable("audit log: closed")
	}
}

// awaitAudit waits for rec's write; the request is done, so a
// cancelled caller still waits for its entry.
func (s *Service) awaitAudit(rec auditWrite) error {
	var err error
	select {
	case err = <-rec.done:
	case <-s.auditDone:
		// The writer has stopped; it may have answered just before.
		select {
		case err = <-rec.done:
		default:
			err = errors.New("closed before the entry was written")
		}
	}
	if err != nil {
		return errdefs.Unavailable("audit log: %v", err)
	}
	return nil
}

// auditWrite is one entry waiting for the audit writer.
type auditWrite struct {
	entry AuditEntry
	value []byte
	done  chan error
	// quiet: not published when written (BeginRecord's Finish does);
	// rewrite: replaces the entry of the same key (a begun call's result);
	// unawaited: nobody waits for it (a successful call's result), so the
	// writer may hold it (resultHold).
	quiet, rewrite, unawaited bool
}

// maxAuditBatch bounds the entries of one audit transaction.
const maxAuditBatch = 256

// journalIdle is how long the journal waits without entries before it is
// compacted.
const journalIdle = 250 * time.Millisecond

// resultHold is how long, by default, the writer may hold the result
// record of a successful begun call (its "started" entry is durable and
// nobody waits for the result) so that the next batch carries it:
// back-to-back execs then take one sync each, not two.
const resultHold = 10 * time.Millisecond

// writeAudit commits queued entries, as many per batch as are waiting,
// until stopAudit closes; what is queued then is committed last (Finish's
// rewrites of successful calls, which nobody waits for), and the journal
// compacted. A batch of nothing but such rewrites is held for up to
// s.resultHold, to ride with the next one.
func (s *Service) writeAudit() {
	defer close(s.auditDone)
	idle := time.NewTimer(journalIdle)
	idle.Stop()
	defer idle.Stop()
	hold := time.NewTimer(s.resultHold)
	hold.Stop()
	defer hold.Stop()
	// s.held changes only here, so the writer reads it without the lock.
	commit := func(batch []auditWrite) {
		if len(s.held)+len(batch) > maxAuditBatch {
			s.commitBatch(s.held)
		} else {
			batch = append(slices.Clip(s.held), batch...)
		}
		hold.Stop()
		s.commitBatch(batch)
		s.setHeld(nil)
		if s.journal != nil {
			if s.journalFull() {
				s.compact()
			} else {
				idle.Reset(journalIdle)
			}
		}
	}
	for {
		select {
		case w := <-s.auditQ:
			batch := s.takeQueued([]auditWrite{w})
			if !slices.ContainsFunc(batch, func(w auditWrite) bool { return !w.unawaited }) && len(s.held)+len(batch) <= maxAuditBatch {
				if len(s.held) == 0 {
					hold.Reset(s.resultHold)
				}
				s.setHeld(append(s.held, batch...))
				continue
			}
			commit(batch)
		case <-hold.C:
			commit(nil)
		case <-idle.C:
			s.compact()
		case <-s.stopAudit:
			s.commitBatch(s.held)
			s.setHeld(nil)
			for batch := s.takeQueued(nil); len(batch) > 0; batch = s.takeQueued(nil) {
				s.commitBatch(batch)
			}
			if s.journal != nil {
				s.compact()
			}
			return
		}
	}
}

func (s *Service) commitBatch(batch []auditWrite) {
	if len(batch) == 0 {
		return
	}
	if s.journal != nil {
		s.commitJournal(batch)
	} else {
		s.commitAudit(batch)
	}
}

// compact compacts the journal; a failure is logged, and its entries stay
// in the journal, replayed at the next start if no later compaction takes
// them.
func (s *Service) compact() {
	if err := s.compactJournal(); err != nil {
		s.log.Error("audit journal: compaction failed; its entries stay in the journal", "err", err)
	}
}

// takeQueued adds what is queued now to batch, up to maxAuditBatch.
func (s *Service) takeQueued(batch []auditWrite) []auditWrite {
	for len(batch) < maxAuditBatch {
		select {
		case w := <-s.auditQ:
			batch = append(batch, w)
		default:
			return batch
		}
	}
	return batch
}

// commitAudit writes batch in one store transaction (no journal) and
// answers each entry.
func (s *Service) commitAudit(batch []auditWrite) {
	conds := make([]Cond, 0, len(batch))
	writes := make([]Write, len(batch))
	for i, w := range batch {
		if !w.rewrite {
			conds = append(conds, Cond{Key: w.entry.Key, Rev: 0})
		}
		writes[i] = Write{Key: w.entry.Key, Value: w.value}
	}
	err := s.store.Txn(context.Background(), conds, writes)
	for _, w := range batch {
		if err == nil && !w.quiet {
			s.publish(w.entry)
		}
		w.done <- err
	}
}

// AuditFilter selects audit entries.
type AuditFilter struct {
	// Project keeps entries of this project and beneath it ("" all p sees).
	Project string
	// After is a Key: only later entries.
	After string
	// Limit keeps the last Limit entries (0: all).
	Limit int
}

func (f AuditFilter) keep(p Principal, e AuditEntry) bool {
	if e.Key <= f.After {
		return false
	}
	if !p.NodeAdmin && (e.NodeAdmin || !p.Administers(e.Project)) {
		return false
	}
	return f.Project == "" || (!e.NodeAdmin && Within(e.Project, f.Project))
}

func (s *Service) checkAuditReader(p Principal, f AuditFilter) error {
	if f.Project != "" && !p.Sees(f.Project) {
		return errdefs.NotFound("project %s: not found", f.Project)
	}
	if !p.Administers(or(f.Project, p.Project)) {
		return errdefs.PermissionDenied("audit: %s may not read the audit log (needs the admin role)", p)
	}
	return nil
}

// ListAudit returns the entries p may read (an admin: its project's and
// beneath; the node administrator: all), oldest first.
func (s *Service) ListAudit(ctx context.Context, p Principal, f AuditFilter) ([]AuditEntry, error) {
	if err := s.checkAuditReader(p, f); err != nil {
		return nil, err
	}
	// The journal's entries before the store's: see mergePending.
	pending := s.pendingAudit()
	entries, err := s.store.List(ctx, auditPrefix)
	if err != nil {
		return nil, err
	}
	all := make([]AuditEntry, 0, len(entries))
	for _, kv := range entries {
		var e AuditEntry
		if err := json.Unmarshal(kv.Value, &e); err != nil {
			return nil, fmt.Errorf("decode %s: %w", kv.Key, err)
		}
		all = append(all, e)
	}
	var out []AuditEntry
	for _, e := range mergePending(all, pending) {
		if f.keep(p, e) {
			out = append(out, e)
		}
	}
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[len(out)-f.Limit:]
	}
	return out, nil
}

// FollowAudit calls fn with every entry p may read recorded after the
// listing f selects (which it sends first), until ctx ends or fn fails.
// A follower that falls far behind is cut off with an error.
func (s *Service) FollowAudit(ctx context.Context, p Principal, f AuditFilter, fn func(AuditEntry) error) error {
	if err := s.checkAuditReader(p, f); err != nil {
		return err
	}
	ch := make(chan AuditEntry, 1024)
	s.subMu.Lock()
	s.subs[ch] = struct{}{}
	s.subMu.Unlock()
	defer s.unsubscribe(ch)
	past, err := s.ListAudit(ctx, p, f)
	if err != nil {
		return err
	}
	// Entries recorded meanwhile may come both ways; the live feed's
	// order is not the keys' order, so skip by key, not by cursor.
	seen := map[string]bool{}
	last := f.After
	for _, e := range past {
		if err := fn(e); err != nil {
			return err
		}
		seen[e.Key], last = true, e.Key
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-ch:
			if !ok {
				return errdefs.Unavailable("audit follow: fell behind by more than %d entries; list from %s to catch up", cap(ch), last)
			}
			if seen[e.Key] || !f.keep(p, e) {
				continue
			}
			if err := fn(e); err != nil {
				return err
			}
			last = e.Key
		}
	}
}

func (s *Service) publish(e AuditEntry) {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	for ch := range s.subs {
		select {
		case ch <- e:
		default:
			delete(s.subs, ch)
			close(ch)
		}
	}
}

func (s *Service) unsubscribe(ch chan AuditEntry) {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	if _, ok := s.subs[ch]; ok {
		delete(s.subs, ch)
		close(ch)
	}
}

// Summarize joins key=value pairs for an entry's summary, truncating
// long values.
func Summarize(kv ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		v := kv[i+1]
		if len(v) > 120 {
			v = v[:120] + "…"
		}
		fmt.Fprintf(&b, "%s=%q", kv[i], v)
	}
	return b.String()
}
