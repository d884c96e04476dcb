package iam

import "context"

// Store keeps IAM records (projects, quotas, tokens, audit cursors) as
// values under slash-separated keys. Every value has a revision, so that a
// change checked against several records (a quota along a project's
// ancestors) is one atomic transaction on one node and across control
// instances alike. Implementations: bbolt on a single node, etcd in a
// cluster.
type Store interface {
	// Get returns the value of key and its revision, or an error wrapping
	// errdefs.ErrNotFound.
	Get(ctx context.Context, key string) (value []byte, rev int64, err error)
	// List returns every record whose key starts with prefix, in key order.
	List(ctx context.Context, prefix string) ([]Entry, error)
	// Txn applies every write if every condition holds, atomically;
	// otherwise it applies none and returns an error wrapping
	// errdefs.ErrFailedPrecondition (the caller re-reads and retries).
	Txn(ctx context.Context, conds []Cond, writes []Write) error
	// Close releases the store.
	Close() error
}

// Entry is one record.
type Entry struct {
	Key   string
	Value []byte
	Rev   int64
}

// Cond requires Key to be at revision Rev; Rev 0 requires Key to be absent.
type Cond struct {
	Key string
	Rev int64
}

// Write sets Key to Value, or deletes Key when Delete is set.
type Write struct {
	Key    string
	Value  []byte
	Delete bool
}
