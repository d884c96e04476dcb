package iam_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/iam"
)

// TestAuditBeginFinish: an entry begun while its call runs is in the log,
// durably, once Finish returns: with "ok", or rewritten in place with the
// failure of a failed call; a follower sees each call once, with its final
// result, and a reopened store holds both entries.
func TestAuditBeginFinish(t *testing.T) {
	path := filepath.Join(t.TempDir(), "iam.db")
	st, err := iam.OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	svc := iam.New(iam.Config{Store: st})
	ctx := context.Background()

	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	seen := make(chan iam.AuditEntry, 10)
	go func() {
		_ = svc.FollowAudit(fctx, admin, iam.AuditFilter{}, func(e iam.AuditEntry) error { seen <- e; return nil })
	}()
	// The follower is subscribed once it has sent the past: one entry.
	if err := svc.Record(ctx, admin, iam.AuditEntry{Procedure: "/t/First", Result: "ok"}); err != nil {
		t.Fatal(err)
	}
	<-seen

	ok := svc.BeginRecord(admin, iam.AuditEntry{Procedure: "/t/Run", Summary: "good"})
	bad := svc.BeginRecord(admin, iam.AuditEntry{Procedure: "/t/Run", Summary: "bad"})
	// Until Finish the log says the calls started, not how they ended.
	for deadline := time.Now().Add(10 * time.Second); ; {
		got, err := svc.ListAudit(ctx, admin, iam.AuditFilter{})
		if err != nil {
			t.Fatal(err)
		}
		started := 0
		for _, e := range got {
			if e.Procedure == "/t/Run" {
				if e.Result != iam.AuditStarted {
					t.Fatalf("before Finish %s is logged %q, want %q", e.Summary, e.Result, iam.AuditStarted)
				}
				started++
			}
		}
		if started == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 begun entries written", started)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := ok.Finish("ok"); err != nil {
		t.Fatal(err)
	}
	if err := bad.Finish("NotFound: no such command"); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"good": "ok", "bad": "NotFound: no such command"}
	for range 2 {
		select {
		case e := <-seen:
			if want[e.Summary] != e.Result {
				t.Errorf("follower got %s with %q, want %q", e.Summary, e.Result, want[e.Summary])
			}
			delete(want, e.Summary)
		case <-time.After(10 * time.Second):
			t.Fatalf("follower saw nothing; missing %v", want)
		}
	}
	select {
	case e := <-seen:
		t.Errorf("follower saw a call twice: %+v", e)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	svc.Close() // closes st

	st, err = iam.OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	svc = iam.New(iam.Config{Store: st})
	defer svc.Close()
	got, err := svc.ListAudit(ctx, admin, iam.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]string{}
	for _, e := range got {
		if e.Procedure == "/t/Run" {
			results[e.Summary] = e.Result
		}
	}
	if len(results) != 2 || results["good"] != "ok" || results["bad"] != "NotFound: no such command" {
		t.Errorf("after reopening, the log holds %v; want good ok and bad rewritten with its failure, once each", results)
	}
}
