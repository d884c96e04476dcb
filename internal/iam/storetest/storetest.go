// Package storetest is the contract every iam.Store implementation must
// meet (bbolt on one node, etcd in a cluster): revisions, atomic
// conditional transactions, prefix listing and durability across a reopen.
// Only _test files import it; it imports iam and errdefs.
package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// Opener opens the store under test. Called twice with the same t, it must
// return the same underlying data (the second call after the first store
// was closed): that checks durability.
type Opener func(t *testing.T) iam.Store

// Run runs the contract against stores made by open.
func Run(t *testing.T, open Opener) {
	ctx := context.Background()
	t.Run("GetMissing", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		if _, _, err := s.Get(ctx, "nope"); !errdefs.IsNotFound(err) {
			t.Fatalf("Get of a missing key: %v, want not found", err)
		}
	})
	t.Run("CreateOnlyIfAbsent", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		put := []iam.Write{{Key: "k/a", Value: []byte("1")}}
		if err := s.Txn(ctx, []iam.Cond{{Key: "k/a", Rev: 0}}, put); err != nil {
			t.Fatalf("create: %v", err)
		}
		err := s.Txn(ctx, []iam.Cond{{Key: "k/a", Rev: 0}}, []iam.Write{{Key: "k/a", Value: []byte("2")}})
		if !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("second create: %v, want failed precondition", err)
		}
		v, rev, err := s.Get(ctx, "k/a")
		if err != nil || string(v) != "1" || rev <= 0 {
			t.Fatalf("Get = %q, %d, %v; want \"1\" at a positive revision", v, rev, err)
		}
	})
	t.Run("RevisionsAdvance", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		mustTxn(t, s, nil, iam.Write{Key: "r", Value: []byte("a")})
		_, r1, _ := s.Get(ctx, "r")
		mustTxn(t, s, []iam.Cond{{Key: "r", Rev: r1}}, iam.Write{Key: "r", Value: []byte("b")})
		v, r2, _ := s.Get(ctx, "r")
		if r2 <= r1 || string(v) != "b" {
			t.Fatalf("after an update: %q at %d (was %d); want \"b\" at a higher revision", v, r2, r1)
		}
		// A stale revision fails and writes nothing.
		err := s.Txn(ctx, []iam.Cond{{Key: "r", Rev: r1}}, []iam.Write{{Key: "r", Value: []byte("c")}, {Key: "other", Value: []byte("x")}})
		if !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("stale update: %v, want failed precondition", err)
		}
		if v, _, _ := s.Get(ctx, "r"); string(v) != "b" {
			t.Fatalf("stale update wrote %q", v)
		}
		if _, _, err := s.Get(ctx, "other"); !errdefs.IsNotFound(err) {
			t.Fatalf("a failed Txn applied part of its writes: %v", err)
		}
	})
	t.Run("MultiKeyAtomic", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		mustTxn(t, s, nil, iam.Write{Key: "m/1", Value: []byte("x")}, iam.Write{Key: "m/2", Value: []byte("y")})
		_, r1, _ := s.Get(ctx, "m/1")
		_, r2, _ := s.Get(ctx, "m/2")
		mustTxn(t, s, []iam.Cond{{Key: "m/1", Rev: r1}, {Key: "m/2", Rev: r2}},
			iam.Write{Key: "m/1", Delete: true}, iam.Write{Key: "m/3", Value: []byte("z")})
		if _, _, err := s.Get(ctx, "m/1"); !errdefs.IsNotFound(err) {
			t.Fatalf("deleted key still there: %v", err)
		}
		// Deleted: a Rev 0 condition holds again.
		mustTxn(t, s, []iam.Cond{{Key: "m/1", Rev: 0}}, iam.Write{Key: "m/1", Value: []byte("again")})
	})
	t.Run("ListPrefixInOrder", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		for _, k := range []string{"p/b", "p/a", "p/a/x", "pq", "o"} {
			mustTxn(t, s, nil, iam.Write{Key: k, Value: []byte(k)})
		}
		got, err := s.List(ctx, "p/")
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, e := range got {
			if string(e.Value) != e.Key || e.Rev <= 0 {
				t.Errorf("entry %s: value %q rev %d", e.Key, e.Value, e.Rev)
			}
			keys = append(keys, e.Key)
		}
		if fmt.Sprint(keys) != "[p/a p/a/x p/b]" {
			t.Fatalf("List(p/) = %v, want [p/a p/a/x p/b]", keys)
		}
	})
	t.Run("ConcurrentIncrementsSerialise", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		Increments(t, "ctr", 10, s, s, s, s)
	})
	t.Run("DurableAcrossReopen", func(t *testing.T) {
		s := open(t)
		mustTxn(t, s, nil, iam.Write{Key: "d", Value: []byte("kept")})
		_, rev, _ := s.Get(ctx, "d")
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = open(t)
		defer s.Close()
		v, rev2, err := s.Get(ctx, "d")
		if err != nil || string(v) != "kept" || rev2 != rev {
			t.Fatalf("after reopen: %q rev %d (was %d), %v", v, rev2, rev, err)
		}
		mustTxn(t, s, nil, iam.Write{Key: "d2", Value: []byte("x")})
		if _, rev3, _ := s.Get(ctx, "d2"); rev3 <= rev {
			t.Fatalf("revision went back after a reopen: %d after %d", rev3, rev)
		}
	})
}

func mustTxn(t *testing.T, s iam.Store, conds []iam.Cond, writes ...iam.Write) {
	t.Helper()
	if err := s.Txn(context.Background(), conds, writes); err != nil {
		t.Fatalf("Txn: %v", err)
	}
}

// Increments is the quota pattern: one worker per entry of stores (the same
// store may stand several times, or instances on one cluster) increments
// key each times by read-check-write with retries, concurrently; no
// increment may be lost.
func Increments(t *testing.T, key string, each int, stores ...iam.Store) {
	t.Helper()
	ctx := context.Background()
	mustTxn(t, stores[0], nil, iam.Write{Key: key, Value: []byte("0")})
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				for {
					v, rev, err := s.Get(ctx, key)
					if err != nil {
						t.Error(err)
						return
					}
					var n int
					fmt.Sscan(string(v), &n)
					err = s.Txn(ctx, []iam.Cond{{Key: key, Rev: rev}}, []iam.Write{{Key: key, Value: fmt.Appendf(nil, "%d", n+1)}})
					if err == nil {
						break
					}
					if !errdefs.IsFailedPrecondition(err) {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if v, _, _ := stores[0].Get(ctx, key); string(v) != fmt.Sprint(len(stores)*each) {
		t.Fatalf("%s = %s after %d compare-and-swap increments", key, v, len(stores)*each)
	}
}
