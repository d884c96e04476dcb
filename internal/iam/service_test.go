package iam_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

var admin = iam.Principal{NodeAdmin: true}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newService(t *testing.T) (*iam.Service, *clock, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "iam.db")
	st, err := iam.OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	svc := iam.New(iam.Config{Store: st, Now: c.now})
	t.Cleanup(func() { svc.Close() })
	return svc, c, path
}

func mustProject(t *testing.T, svc *iam.Service, p iam.Principal, path string, q iam.Quota) {
	t.Helper()
	if _, err := svc.CreateProject(context.Background(), p, path, q); err != nil {
		t.Fatalf("create project %s: %v", path, err)
	}
}

// TestTokens: secrets authenticate, are stored only as hashes, and stop
// working at once when revoked or expired, or when their project goes.
func TestTokens(t *testing.T) {
	svc, clk, path := newService(t)
	ctx := context.Background()
	mustProject(t, svc, admin, "team", iam.Quota{})
	tok, secret, err := svc.CreateToken(ctx, admin, "team", iam.RoleMember, time.Minute, "ci")
	if err != nil {
		t.Fatal(err)
	}
	p, err := svc.Authenticate(ctx, secret)
	if err != nil || p.Project != "team" || p.Role != iam.RoleMember || p.TokenID != tok.ID || p.NodeAdmin {
		t.Fatalf("Authenticate = %+v, %v", p, err)
	}
	for _, bad := range []string{"", "corral_", "Bearer x", secret + "x", strings.Replace(secret, tok.ID, "000000000000", 1)} {
		if _, err := svc.Authenticate(ctx, bad); !errdefs.IsUnauthenticated(err) {
			t.Errorf("Authenticate(%q) = %v, want unauthenticated", bad, err)
		}
	}
	// A member cannot mint tokens; an admin of the project can, not above it.
	if _, _, err := svc.CreateToken(ctx, p, "team", iam.RoleAdmin, 0, ""); !errdefs.IsPermissionDenied(err) {
		t.Errorf("member creates a token: %v, want permission denied", err)
	}
	clk.add(time.Minute)
	if _, err := svc.Authenticate(ctx, secret); !errdefs.IsUnauthenticated(err) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired token: %v, want unauthenticated (expired)", err)
	}
	_, secret2, err := svc.CreateToken(ctx, admin, "team", iam.RoleAdmin, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	p2, err := svc.Authenticate(ctx, secret2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.RevokeToken(ctx, p2, p2.TokenID); err != nil {
		t.Fatalf("revoke own token: %v", err)
	}
	if _, err := svc.Authenticate(ctx, secret2); !errdefs.IsUnauthenticated(err) {
		t.Errorf("revoked token: %v, want unauthenticated", err)
	}
	_, secret3, _ := svc.CreateToken(ctx, admin, "team", iam.RoleViewer, 0, "")
	if err := svc.DeleteProject(ctx, admin, "team", false); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Authenticate(ctx, secret3); !errdefs.IsUnauthenticated(err) {
		t.Errorf("token of a deleted project: %v, want unauthenticated", err)
	}
	svc.Close()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{secret, secret2, secret3} {
		if bytes.Contains(raw, []byte(s)) || bytes.Contains(raw, []byte(s[len(s)-20:])) {
			t.Errorf("the store holds a token secret in clear")
		}
	}
}

// TestDelegationNeverExceedsParent: a child gets at most what its parent
// has not given away, also when children are made concurrently, and a
// parent cannot shrink below what it gave.
func TestDelegationNeverExceedsParent(t *testing.T) {
	svc, _, _ := newService(t)
	ctx := context.Background()
	mustProject(t, svc, admin, "job", iam.Quota{MaxSandboxes: 10, MemoryBytes: 10 << 30, CallsPerSec: 100})
	_, secret, _ := svc.CreateToken(ctx, admin, "job", iam.RoleAdmin, 0, "")
	jobAdmin, _ := svc.Authenticate(ctx, secret)
	mustProject(t, svc, jobAdmin, "job/a", iam.Quota{MaxSandboxes: 6})
	_, err := svc.CreateProject(ctx, jobAdmin, "job/b", iam.Quota{MaxSandboxes: 5})
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "project job: quota max_sandboxes") || !strings.Contains(err.Error(), "has 4 left") {
		t.Fatalf("child asking more than is left: %v", err)
	}
	mustProject(t, svc, jobAdmin, "job/b", iam.Quota{MaxSandboxes: 4, CallsPerSec: 100})
	if _, err := svc.SetQuota(ctx, jobAdmin, "job/a", iam.Quota{MaxSandboxes: 7}); !errdefs.IsResourceExhausted(err) {
		t.Errorf("raising a child past the parent: %v", err)
	}
	if _, err := svc.SetQuota(ctx, jobAdmin, "job/a", iam.Quota{MaxSandboxes: 2}); err != nil {
		t.Errorf("lowering a child: %v", err)
	}
	if _, err := svc.SetQuota(ctx, admin, "job", iam.Quota{MaxSandboxes: 5}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("shrinking the parent below what it gave (6): %v", err)
	}
	// An admin of job may not raise job's own quota, nor touch a sibling tree.
	if _, err := svc.SetQuota(ctx, jobAdmin, "job", iam.Quota{MaxSandboxes: 100}); err == nil {
		t.Error("a project admin raised its own quota")
	}
	mustProject(t, svc, admin, "other", iam.Quota{})
	if _, err := svc.CreateProject(ctx, jobAdmin, "other/x", iam.Quota{}); !errdefs.IsNotFound(err) {
		t.Errorf("admin of job creates under other: %v, want not found", err)
	}
	// Concurrent children of c (limit 10): the sum given never passes it.
	mustProject(t, svc, jobAdmin, "job/a/c", iam.Quota{MaxSandboxes: 2})
	mustProject(t, svc, admin, "wide", iam.Quota{MaxSandboxes: 10})
	var wg sync.WaitGroup
	var mu sync.Mutex
	made := 0
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := svc.CreateProject(ctx, admin, fmt.Sprintf("wide/k%d", i), iam.Quota{MaxSandboxes: 3}); err == nil {
				mu.Lock()
				made++
				mu.Unlock()
			} else if !errdefs.IsResourceExhausted(err) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if made != 3 {
		t.Errorf("%d children of 3 made concurrently under a limit of 10, want 3", made)
	}
	wide, _ := svc.GetProject(ctx, admin, "wide")
	if wide.Delegated.MaxSandboxes != 9 {
		t.Errorf("wide delegated %d, want 9", wide.Delegated.MaxSandboxes)
	}
	// Deleting a child gives its quota back.
	if err := svc.DeleteProject(ctx, admin, "wide/k0", false); err != nil && !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
}

// TestAdmissionAtEveryLevel: a create is refused by the first quota on its
// path that it would exceed, naming project, quota, limit and usage.
func TestAdmissionAtEveryLevel(t *testing.T) {
	svc, clk, _ := newService(t)
	ctx := context.Background()
	mustProject(t, svc, admin, "a", iam.Quota{MaxSandboxes: 10, CPUMillis: 4000, MemoryBytes: 8 << 30})
	mustProject(t, svc, admin, "a/b", iam.Quota{MaxSandboxes: 5, CPUMillis: 2000, CreatesPerSec: 2})
	mustProject(t, svc, admin, "a/b/c", iam.Quota{MaxSandboxes: 2})
	usage := map[string]iam.Usage{}
	use := func(path string) iam.Usage { return usage[path] }
	one := iam.Usage{Sandboxes: 1, CPUMillis: 500, MemoryBytes: 1 << 30}
	cases := []struct {
		name    string
		project string
		usage   map[string]iam.Usage
		want    string // "" admitted
	}{
		{"leaf free", "a/b/c", map[string]iam.Usage{}, ""},
		{"leaf full", "a/b/c", map[string]iam.Usage{"a/b/c": {Sandboxes: 2}, "a/b": {Sandboxes: 2}, "a": {Sandboxes: 2}},
			"project a/b/c: quota max_sandboxes: limit 2, in use 2"},
		{"middle full by cpu", "a/b/c", map[string]iam.Usage{"a/b": {Sandboxes: 1, CPUMillis: 1800}, "a": {Sandboxes: 1, CPUMillis: 1800}},
			"project a/b: quota cpu_millis: limit 2000, in use 1800"},
		{"top full by memory", "a/b/c", map[string]iam.Usage{"a": {Sandboxes: 3, MemoryBytes: 15 << 29}},
			"project a: quota memory_bytes: limit 8589934592, in use 8053063680"},
		{"top full by count from a sibling tree", "a/b", map[string]iam.Usage{"a/b": {Sandboxes: 1}, "a": {Sandboxes: 10}},
			"project a: quota max_sandboxes: limit 10, in use 10"},
	}
	for _, tc := range cases {
		usage = tc.usage
		clk.add(time.Second) // refill the creates/s bucket
		err := svc.AdmitSandbox(ctx, tc.project, one, use)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v, want admitted", tc.name, err)
			}
			continue
		}
		if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want resource exhausted %q", tc.name, err, tc.want)
		}
	}
	// creates_per_sec of a/b (2/s) applies to a/b/c's creates too.
	usage = map[string]iam.Usage{}
	clk.add(time.Second)
	for i := range 2 {
		if err := svc.AdmitSandbox(ctx, "a/b/c", one, use); err != nil {
			t.Fatalf("create %d within the rate: %v", i, err)
		}
	}
	if err := svc.AdmitSandbox(ctx, "a/b/c", one, use); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "project a/b: quota creates_per_sec: limit 2/s") {
		t.Errorf("third create in a second: %v", err)
	}
	clk.add(500 * time.Millisecond)
	if err := svc.AdmitSandbox(ctx, "a/b/c", one, use); err != nil {
		t.Errorf("after the bucket refilled one: %v", err)
	}
	if err := svc.AdmitSandbox(ctx, "a/gone", one, use); !errdefs.IsNotFound(err) {
		t.Errorf("create in a missing project: %v", err)
	}
}

// TestAuditListAndFollow: entries are scoped to what the reader administers
// and a follower sees entries recorded after it started.
func TestAuditListAndFollow(t *testing.T) {
	svc, _, _ := newService(t)
	ctx := context.Background()
	mustProject(t, svc, admin, "x", iam.Quota{})
	mustProject(t, svc, admin, "y", iam.Quota{})
	_, sx, _ := svc.CreateToken(ctx, admin, "x", iam.RoleAdmin, 0, "")
	px, _ := svc.Authenticate(ctx, sx)
	_, sv, _ := svc.CreateToken(ctx, admin, "x", iam.RoleViewer, 0, "")
	pv, _ := svc.Authenticate(ctx, sv)
	py := iam.Principal{Project: "y", Role: iam.RoleAdmin, TokenID: "000000000001"}
	for _, p := range []iam.Principal{admin, px, py} {
		if err := svc.Record(ctx, p, iam.AuditEntry{Procedure: "/t/Do", Summary: p.String(), Result: "ok"}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := svc.ListAudit(ctx, px, iam.AuditFilter{})
	if err != nil || len(got) != 1 || got[0].Project != "x" || got[0].TokenID != px.TokenID {
		t.Fatalf("x's admin lists %+v, %v; want its one entry", got, err)
	}
	if all, _ := svc.ListAudit(ctx, admin, iam.AuditFilter{}); len(all) != 3 {
		t.Errorf("node admin lists %d entries, want 3", len(all))
	}
	if _, err := svc.ListAudit(ctx, pv, iam.AuditFilter{}); !errdefs.IsPermissionDenied(err) {
		t.Errorf("viewer reads the audit log: %v", err)
	}
	fctx, cancel := context.WithCancel(ctx)
	seen := make(chan iam.AuditEntry, 10)
	done := make(chan error)
	go func() {
		done <- svc.FollowAudit(fctx, px, iam.AuditFilter{}, func(e iam.AuditEntry) error { seen <- e; return nil })
	}()
	<-seen // the past entry
	_ = svc.Record(ctx, py, iam.AuditEntry{Procedure: "/t/Other", Result: "ok"})
	_ = svc.Record(ctx, px, iam.AuditEntry{Procedure: "/t/Later", Result: "ok"})
	select {
	case e := <-seen:
		if e.Procedure != "/t/Later" {
			t.Errorf("follower got %+v, want /t/Later (y's entry is not x's)", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follower saw nothing")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("follow ended with %v", err)
	}
}

// TestConcurrentAuditRecords: records made at once (sharing transactions)
// are each in the log once, and a closed service refuses new ones.
func TestConcurrentAuditRecords(t *testing.T) {
	svc, _, _ := newService(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Go(func() {
			if err := svc.Record(ctx, admin, iam.AuditEntry{Procedure: "/t/Do", Summary: fmt.Sprint(i), Result: "ok"}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got, err := svc.ListAudit(ctx, admin, iam.AuditFilter{})
	seen := map[string]bool{}
	for _, e := range got {
		seen[e.Summary] = true
	}
	if err != nil || len(got) != 300 || len(seen) != 300 {
		t.Fatalf("%d entries (%d distinct), %v; want 300", len(got), len(seen), err)
	}
	svc.Close()
	if err := svc.Record(ctx, admin, iam.AuditEntry{Procedure: "/t/Late"}); !errdefs.IsUnavailable(err) {
		t.Errorf("record after close: %v, want unavailable", err)
	}
}
