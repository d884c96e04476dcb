package etcdstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/etcdembed"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/iam/etcdstore"
	"github.com/corral-dev/corral/internal/iam/storetest"
)

// open starts a real single-member etcd (ports 17500-17501) and returns two
// stores on separate connections, as two control instances would have.
func open(t *testing.T) (a, b *etcdstore.Store) {
	t.Helper()
	ctx := context.Background()
	c, err := etcdembed.StartCluster(ctx, t.TempDir(), 1, 17500, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	for _, s := range []**etcdstore.Store{&a, &b} {
		st, err := etcdstore.Open(ctx, c.Endpoints(), "/test/iam/")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		*s = st
	}
	return a, b
}

// TestStoreContract runs the contract every iam.Store meets; each subtest
// gets a prefix of its own on one etcd member, and reopening is a new
// connection on the same prefix.
func TestStoreContract(t *testing.T) {
	ctx := context.Background()
	c, err := etcdembed.StartCluster(ctx, t.TempDir(), 1, 17500, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	storetest.Run(t, func(t *testing.T) iam.Store {
		s, err := etcdstore.Open(ctx, c.Endpoints(), "/test/"+t.Name()+"/")
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestStoreSemantics(t *testing.T) {
	ctx := context.Background()
	s, other := open(t)

	if _, _, err := s.Get(ctx, "projects/a"); !errdefs.IsNotFound(err) {
		t.Fatalf("get of a missing key: %v, want not found", err)
	}
	// Rev 0 = must be absent: creating twice fails the second time.
	create := func(st *etcdstore.Store, key, val string) error {
		return st.Txn(ctx, []iam.Cond{{Key: key}}, []iam.Write{{Key: key, Value: []byte(val)}})
	}
	if err := create(s, "projects/a", "one"); err != nil {
		t.Fatal(err)
	}
	if err := create(other, "projects/a", "two"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("second create from another instance: %v, want failed precondition", err)
	}
	v, rev, err := other.Get(ctx, "projects/a")
	if err != nil || string(v) != "one" || rev <= 0 {
		t.Fatalf("get = %q rev %d, %v; want one at a positive rev", v, rev, err)
	}
	// A write conditioned on a stale revision fails and changes nothing.
	if err := s.Txn(ctx, []iam.Cond{{Key: "projects/a", Rev: rev}}, []iam.Write{{Key: "projects/a", Value: []byte("three")}}); err != nil {
		t.Fatal(err)
	}
	_, rev2, _ := s.Get(ctx, "projects/a")
	if rev2 <= rev {
		t.Fatalf("revision did not grow on write: %d then %d", rev, rev2)
	}
	err = other.Txn(ctx, []iam.Cond{{Key: "projects/a", Rev: rev}}, []iam.Write{{Key: "projects/a", Value: []byte("stale")}})
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("write at a stale rev: %v, want failed precondition", err)
	}
	// All or nothing: one failing condition of two applies no write.
	err = s.Txn(ctx,
		[]iam.Cond{{Key: "projects/a", Rev: rev2}, {Key: "projects/b", Rev: 12345}},
		[]iam.Write{{Key: "projects/a", Value: []byte("x")}, {Key: "projects/c", Value: []byte("y")}})
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("txn with a failing condition: %v", err)
	}
	if v, _, _ := s.Get(ctx, "projects/a"); string(v) != "three" {
		t.Fatalf("partially applied: projects/a = %q", v)
	}
	if _, _, err := s.Get(ctx, "projects/c"); !errdefs.IsNotFound(err) {
		t.Fatalf("partially applied: projects/c exists (%v)", err)
	}
	// List is by prefix, in key order, with revisions.
	for _, k := range []string{"projects/c", "projects/b", "tokens/t1", "projects/a/sub"} {
		if err := create(s, k, k); err != nil {
			t.Fatal(err)
		}
	}
	ents, err := other.List(ctx, "projects/")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range ents {
		keys = append(keys, e.Key)
		if e.Rev <= 0 {
			t.Errorf("entry %s has rev %d", e.Key, e.Rev)
		}
	}
	if fmt.Sprint(keys) != "[projects/a projects/a/sub projects/b projects/c]" {
		t.Fatalf("list projects/ = %v", keys)
	}
	// Delete, conditioned; then the key is absent (rev 0 holds again).
	_, rb, _ := s.Get(ctx, "projects/b")
	if err := s.Txn(ctx, []iam.Cond{{Key: "projects/b", Rev: rb}}, []iam.Write{{Key: "projects/b", Delete: true}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := other.Get(ctx, "projects/b"); !errdefs.IsNotFound(err) {
		t.Fatalf("get after delete: %v", err)
	}
	if err := create(other, "projects/b", "again"); err != nil {
		t.Fatalf("create after delete: %v", err)
	}
	// Bad input is refused by name.
	if err := s.Txn(ctx, nil, []iam.Write{{Key: "k", Value: []byte("1")}, {Key: "k", Value: []byte("2")}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("double write: %v", err)
	}
	if _, _, err := s.Get(ctx, ""); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("empty key: %v", err)
	}
}

// TestStoreCompareAndSwapAcrossInstances is the quota pattern: two
// instances increment one counter by read-check-write with retries; no
// increment is lost.
func TestStoreCompareAndSwapAcrossInstances(t *testing.T) {
	a, b := open(t)
	storetest.Increments(t, "quota/used", 25, a, b, a, b, a, b, a, b)
}
