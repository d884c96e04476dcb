package state

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

// TestSlotsSurviveRestart: slots are handed out lowest first, reused once
// freed, stable per owner, bounded, and still held after a reopen.
func TestSlotsSurviveRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	claim := func(owner string, want int) {
		t.Helper()
		got, err := db.Claim(owner, 3)
		if err != nil || got != want {
			t.Fatalf("Claim(%s) = %d, %v; want %d", owner, got, err, want)
		}
	}
	claim("a", 0)
	claim("b", 1)
	claim("a", 0) // idempotent
	if err := db.Free("a"); err != nil {
		t.Fatal(err)
	}
	claim("c", 0) // a's slot, reused
	claim("d", 2)
	if _, err := db.Claim("e", 3); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("claim past the limit: %v, want resource exhausted", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if db, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	claim("b", 1)
	owners, err := db.Owners()
	slices.Sort(owners)
	if err != nil || !slices.Equal(owners, []string{"b", "c", "d"}) {
		t.Fatalf("owners after reopen: %v, %v", owners, err)
	}
	if err := db.Free("nobody"); err != nil {
		t.Fatalf("free of an owner without a slot: %v", err)
	}
}
