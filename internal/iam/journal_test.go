package iam_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/iam"
)

// openJournaled opens the bolt store in dir, wrapped by wrap (nil: as is),
// with the audit journal in front of it.
func openJournaled(t *testing.T, dir string, wrap func(iam.Store) iam.Store, configure ...func(*iam.Config)) *iam.Service {
	t.Helper()
	bolt, err := iam.OpenBolt(filepath.Join(dir, "iam.db"))
	if err != nil {
		t.Fatal(err)
	}
	var st iam.Store = bolt
	if wrap != nil {
		st = wrap(bolt)
	}
	j, err := iam.OpenAuditJournal(filepath.Join(dir, "audit.journal"), st, nil)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	cfg := iam.Config{Store: st, Journal: j}
	for _, c := range configure {
		c(&cfg)
	}
	return iam.New(cfg)
}

// resultsBySummary lists the whole log as summary -> result, failing on a
// summary logged twice.
func resultsBySummary(t *testing.T, svc *iam.Service) map[string]string {
	t.Helper()
	got, err := svc.ListAudit(context.Background(), admin, iam.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for i, e := range got {
		if _, dup := out[e.Summary]; dup {
			t.Fatalf("%s is logged twice", e.Summary)
		}
		if i > 0 && got[i-1].Key >= e.Key {
			t.Fatalf("listing out of key order at %d: %s after %s", i, e.Key, got[i-1].Key)
		}
		out[e.Summary] = e.Result
	}
	return out
}

const killChildEnv = "CORRAL_TEST_AUDIT_JOURNAL_CHILD"

// TestAuditJournalSurvivesAKill: a process recording entries (plain and
// begun ones, some failed) with idle compactions between bursts is
// SIGKILLed mid-burst; reopening the store replays the journal, and every
// entry whose call was acknowledged is in the log with its result (a
// successful begun call: "ok", or "started" if its rewrite was not yet on
// disk).
func TestAuditJournalSurvivesAKill(t *testing.T) {
	if dir := os.Getenv(killChildEnv); dir != "" {
		journalKillChild(t, dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestAuditJournalSurvivesAKill$", "-test.count=1")
	cmd.Env = append(os.Environ(), killChildEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }() // a no-op once killed below
	acked := map[string]string{}
	sc := bufio.NewScanner(out)
	killed := false
	for sc.Scan() {
		summary, result, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		acked[summary] = result
		// Kill mid-burst (bursts are 200 entries, then an idle pause).
		if n := len(acked); !killed && n >= 700 && n%200 > 40 && n%200 < 150 {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	_ = cmd.Wait()
	if !killed {
		t.Fatalf("the child stopped after %d acknowledged entries, before it was killed", len(acked))
	}
	fi, err := os.Stat(filepath.Join(dir, "audit.journal"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() == 0 {
		t.Fatal("the journal was empty at the kill: the test did not exercise a replay")
	}

	// Idle compactions ran between the bursts: the store alone holds some.
	bolt, err := iam.OpenBolt(filepath.Join(dir, "iam.db"))
	if err != nil {
		t.Fatal(err)
	}
	compacted, err := bolt.List(context.Background(), "audit/")
	bolt.Close()
	if err != nil || len(compacted) == 0 {
		t.Fatalf("before the replay the store holds %d entries (%v): no compaction ran", len(compacted), err)
	}

	svc := openJournaled(t, dir, nil)
	defer svc.Close()
	if fi, err := os.Stat(filepath.Join(dir, "audit.journal")); err != nil || fi.Size() != 0 {
		t.Errorf("journal after the replay: %v, %v; want empty", fi, err)
	}
	got := resultsBySummary(t, svc)
	for summary, want := range acked {
		res, ok := got[summary]
		switch {
		case !ok:
			t.Errorf("acknowledged %s is missing after the kill", summary)
		case want == "ok-or-started" && (res == "ok" || res == iam.AuditStarted):
		case res != want:
			t.Errorf("acknowledged %s is logged %q, want %q", summary, res, want)
		}
	}
	t.Logf("%d acknowledged entries, %d logged after the kill (journal held %d bytes)", len(acked), len(got), fi.Size())
}

// journalKillChild records entries from four goroutines in bursts of 200,
// pausing past the idle compaction after each burst, printing each one once
// its call is acknowledged, until it is killed.
func journalKillChild(t *testing.T, dir string) {
	svc := openJournaled(t, dir, nil)
	ctx := context.Background()
	var mu sync.Mutex
	w := bufio.NewWriter(os.Stdout)
	ack := func(summary, result string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintln(w, summary, result)
		w.Flush()
	}
	var n atomic.Int64
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(400 * time.Millisecond) {
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for range 50 {
					i := n.Add(1)
					summary := fmt.Sprintf("g%d-%d", g, i)
					switch i % 3 {
					case 0:
						if err := svc.Record(ctx, admin, iam.AuditEntry{Procedure: "/t/Do", Summary: summary, Result: "ok"}); err != nil {
							t.Error(err)
							return
						}
						ack(summary, "ok")
					case 1:
						if err := svc.BeginRecord(admin, iam.AuditEntry{Procedure: "/t/Run", Summary: summary}).Finish("ok"); err != nil {
							t.Error(err)
							return
						}
						ack(summary, "ok-or-started")
					default:
						if err := svc.BeginRecord(admin, iam.AuditEntry{Procedure: "/t/Run", Summary: summary}).Finish("NotFound:no-such-command"); err != nil {
							t.Error(err)
							return
						}
						ack(summary, "NotFound:no-such-command")
					}
				}
			})
		}
		wg.Wait()
	}
}

// gateStore holds, while armed, the audit compaction (a transaction
// without conditions) that holds the entry summarised "begun" at the gate,
// and slows every compaction down by slow.
type gateStore struct {
	iam.Store
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
	slow    atomic.Int64
}

func (g *gateStore) Txn(ctx context.Context, conds []iam.Cond, writes []iam.Write) error {
	if len(conds) == 0 {
		if g.armed.Load() && slices.ContainsFunc(writes, func(w iam.Write) bool { return bytes.Contains(w.Value, []byte(`"summary":"begun"`)) }) {
			g.entered <- struct{}{}
			<-g.release
		}
		time.Sleep(time.Duration(g.slow.Load()))
	}
	return g.Store.Txn(ctx, conds, writes)
}

// TestAuditJournalListingsDuringCompaction: a listing made while the
// journal's entries are being moved into the store, and after, holds every
// acknowledged entry once with its latest result, including a begun entry
// compacted as "started" whose rewrite lands in the next journal; and
// listings racing many compactions never miss an acknowledged entry.
func TestAuditJournalListingsDuringCompaction(t *testing.T) {
	dir := t.TempDir()
	gate := &gateStore{entered: make(chan struct{}), release: make(chan struct{})}
	svc := openJournaled(t, dir, func(s iam.Store) iam.Store { gate.Store = s; return gate })
	ctx := context.Background()
	want := map[string]string{}
	check := func(when string) {
		t.Helper()
		got := resultsBySummary(t, svc)
		for s, r := range want {
			if got[s] != r {
				t.Errorf("%s: %s is logged %q, want %q", when, s, got[s], r)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d entries logged, want %d", when, len(got), len(want))
		}
	}

	gate.armed.Store(true)
	for i := range 20 {
		s := fmt.Sprint("rec-", i)
		if err := svc.Record(ctx, admin, iam.AuditEntry{Procedure: "/t/Do", Summary: s, Result: "ok"}); err != nil {
			t.Fatal(err)
		}
		want[s] = "ok"
	}
	if err := svc.BeginRecord(admin, iam.AuditEntry{Procedure: "/t/Run", Summary: "failed"}).Finish("Internal: boom"); err != nil {
		t.Fatal(err)
	}
	want["failed"] = "Internal: boom"
	begun := svc.BeginRecord(admin, iam.AuditEntry{Procedure: "/t/Run", Summary: "begun"})
	want["begun"] = iam.AuditStarted
	select {
	case <-gate.entered: // the idle compaction is under way
	case <-time.After(10 * time.Second):
		t.Fatal("no compaction began after the journal went idle")
	}
	check("during the compaction")
	// The rewrite is queued behind the compaction; nobody waits for it.
	if err := begun.Finish("ok"); err != nil {
		t.Fatal(err)
	}
	check("during the compaction, the begun call finished")
	gate.armed.Store(false)
	close(gate.release)
	want["begun"] = "ok"
	for deadline := time.Now().Add(10 * time.Second); resultsBySummary(t, svc)["begun"] != "ok"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the begun call's result never showed")
		}
	}
	check("after the compaction")

	// Many compactions (idle pauses between bursts, each slowed down),
	// listings racing them: every entry acknowledged before a listing
	// began is in it.
	gate.slow.Store(int64(30 * time.Millisecond))
	var mu sync.Mutex
	acked := map[string]string{}
	for s, r := range want {
		acked[s] = r
	}
	stop := make(chan struct{})
	var writers, listers sync.WaitGroup
	for g := range 2 {
		writers.Go(func() {
			for i := range 120 {
				if i%30 == 29 {
					time.Sleep(300 * time.Millisecond)
				}
				s := fmt.Sprintf("w%d-%d", g, i)
				var err error
				if i%2 == 0 {
					err = svc.Record(ctx, admin, iam.AuditEntry{Procedure: "/t/Do", Summary: s, Result: "ok"})
				} else {
					err = svc.BeginRecord(admin, iam.AuditEntry{Procedure: "/t/Run", Summary: s}).Finish("Aborted: x")
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acked[s] = map[bool]string{true: "ok", false: "Aborted: x"}[i%2 == 0]
				mu.Unlock()
			}
		})
	}
	var lists atomic.Int64
	for range 2 {
		listers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				before := make(map[string]string, len(acked))
				for s, r := range acked {
					before[s] = r
				}
				mu.Unlock()
				got, err := svc.ListAudit(ctx, admin, iam.AuditFilter{})
				if err != nil {
					t.Error(err)
					return
				}
				logged := map[string]string{}
				for _, e := range got {
					logged[e.Summary] = e.Result
				}
				for s, r := range before {
					if logged[s] != r {
						t.Errorf("a listing racing compactions has %s as %q, want %q", s, logged[s], r)
						return
					}
				}
				lists.Add(1)
			}
		})
	}
	writers.Wait()
	close(stop)
	listers.Wait()
	t.Logf("%d listings raced the compactions", lists.Load())

	svc.Close()
	if fi, err := os.Stat(filepath.Join(dir, "audit.journal")); err != nil || fi.Size() != 0 {
		t.Errorf("journal after close: %v, %v; want compacted and empty", fi, err)
	}
	svc = openJournaled(t, dir, nil)
	defer svc.Close()
	want = acked
	check("after reopening")
}

// journalRecord is one record as the journal stores it: length, CRC-32C
// (little-endian), the entry's JSON.
func journalRecord(t *testing.T, e iam.AuditEntry) []byte {
	t.Helper()
	payload, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	rec := binary.LittleEndian.AppendUint32(nil, uint32(len(payload)))
	rec = binary.LittleEndian.AppendUint32(rec, crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli)))
	return append(rec, payload...)
}

// TestAuditJournalTornTail: a journal whose last record is cut short or
// fails its checksum (a write torn by a crash: never acknowledged) opens,
// its whole records replayed (the later of two records of a key winning)
// and the torn one dropped; the journal is then empty.
func TestAuditJournalTornTail(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	entry := func(i int, result string) iam.AuditEntry {
		return iam.AuditEntry{Key: fmt.Sprintf("audit/%020d-0000000%d", at.UnixNano()+int64(i), i), Time: at,
			NodeAdmin: true, Procedure: "/t/Do", Summary: fmt.Sprint("e", i), Result: result}
	}
	whole := journalRecord(t, entry(1, "ok"))
	whole = append(whole, journalRecord(t, entry(2, iam.AuditStarted))...)
	whole = append(whole, journalRecord(t, entry(2, "Internal: boom"))...)
	whole = append(whole, journalRecord(t, entry(3, iam.AuditStarted))...)
	torn := journalRecord(t, entry(4, "ok"))
	badSum := journalRecord(t, entry(4, "ok"))
	badSum[4] ^= 0xff
	for name, tail := range map[string][]byte{
		"short payload": torn[:len(torn)-5],
		"short header":  torn[:5],
		"bad checksum":  badSum,
		"zeros":         make([]byte, 64),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "audit.journal")
			if err := os.WriteFile(path, append(append([]byte{}, whole...), tail...), 0o600); err != nil {
				t.Fatal(err)
			}
			svc := openJournaled(t, dir, nil)
			defer svc.Close()
			got := resultsBySummary(t, svc)
			want := map[string]string{"e1": "ok", "e2": "Internal: boom", "e3": iam.AuditStarted}
			if len(got) != len(want) {
				t.Errorf("replayed %v, want %v", got, want)
			}
			for s, r := range want {
				if got[s] != r {
					t.Errorf("%s replayed as %q, want %q", s, got[s], r)
				}
			}
			if fi, err := os.Stat(path); err != nil || fi.Size() != 0 {
				t.Errorf("journal after the replay: %v, %v; want empty", fi, err)
			}
			// Appends after a replay start a clean journal.
			if err := svc.Record(context.Background(), admin, iam.AuditEntry{Procedure: "/t/Do", Summary: "after", Result: "ok"}); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
				t.Errorf("journal after a record: %v, %v; want the record", fi, err)
			}
		})
	}
}

// recordingStore notes every result a compaction (a transaction without
// conditions) writes, by summary.
type recordingStore struct {
	iam.Store
	mu      sync.Mutex
	results map[string][]string
}

func (r *recordingStore) Txn(ctx context.Context, conds []iam.Cond, writes []iam.Write) error {
	err := r.Store.Txn(ctx, conds, writes)
	if err == nil && len(conds) == 0 {
		r.mu.Lock()
		for _, w := range writes {
			var e iam.AuditEntry
			if json.Unmarshal(w.Value, &e) == nil {
				r.results[e.Summary] = append(r.results[e.Summary], e.Result)
			}
		}
		r.mu.Unlock()
	}
	return err
}

// durableResults is every result on disk, by summary: the journal's
// records, then what compactions moved into the store (read in this
// order, a compaction in between cannot hide a record).
func durableResults(t *testing.T, dir string, rec *recordingStore) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "audit.journal"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for len(b) >= 8 {
		n := int(binary.LittleEndian.Uint32(b))
		if len(b) < 8+n {
			t.Fatalf("journal record of %d bytes cut short", n)
		}
		var e iam.AuditEntry
		if err := json.Unmarshal(b[8:8+n], &e); err != nil {
			t.Fatal(err)
		}
		out[e.Summary] = append(out[e.Summary], e.Result)
		b = b[8+n:]
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for k, v := range rec.results {
		out[k] = append(out[k], v...)
	}
	return out
}

// TestAuditHeldResult: the result of a successful begun call (an exec) is
// not synced on its own but held for the next batch, and shown to listings
// meanwhile; a failed call's result is never held; a held result is
// written by the next entry's batch, at close, and after the hold.
func TestAuditHeldResult(t *testing.T) {
	dir := t.TempDir()
	rec := &recordingStore{results: map[string][]string{}}
	wrap := func(st iam.Store) iam.Store { rec.Store = st; return rec }
	svc := openJournaled(t, dir, wrap, func(c *iam.Config) { c.ResultHold = time.Hour })
	begin := func(summary, result string) {
		t.Helper()
		if err := svc.BeginRecord(admin, iam.AuditEntry{Procedure: "/x/Exec", Summary: summary}).Finish(result); err != nil {
			t.Fatal(err)
		}
	}

	begin("ok-1", "ok")
	// Finish hands the result over without waiting; listings show it once
	// the writer holds it.
	deadline := time.Now().Add(5 * time.Second)
	for resultsBySummary(t, svc)["ok-1"] != "ok" {
		if time.Now().After(deadline) {
			t.Fatal("a held result: not listed 5 s after the call")
		}
		time.Sleep(time.Millisecond)
	}
	if got := durableResults(t, dir, rec)["ok-1"]; !slices.Equal(got, []string{iam.AuditStarted}) {
		t.Fatalf("on disk after the call: %v, want only %q (the result held)", got, iam.AuditStarted)
	}

	begin("failed", "internal: boom")
	got := durableResults(t, dir, rec)
	if !slices.Contains(got["ok-1"], "ok") {
		t.Fatalf("ok-1 on disk after the next call: %v, want its result carried by that call's batch", got["ok-1"])
	}
	if !slices.Contains(got["failed"], "internal: boom") {
		t.Fatalf("a failed call's result on disk: %v, want it written before Finish returned", got["failed"])
	}

	begin("ok-at-close", "ok")
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	svc = openJournaled(t, dir, nil)
	if got := resultsBySummary(t, svc)["ok-at-close"]; got != "ok" {
		t.Fatalf("a result held at close, after reopening: %q, want ok", got)
	}
	svc.Close()

	// The default hold: written within it, with nothing after it.
	rec = &recordingStore{results: map[string][]string{}}
	svc = openJournaled(t, dir, wrap)
	defer svc.Close()
	begin("ok-alone", "ok")
	deadline = time.Now().Add(5 * time.Second)
	for !slices.Contains(durableResults(t, dir, rec)["ok-alone"], "ok") {
		if time.Now().After(deadline) {
			t.Fatal("a held result alone: not on disk 5 s after the call")
		}
		time.Sleep(time.Millisecond)
	}
}
