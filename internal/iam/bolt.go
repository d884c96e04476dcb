package iam

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/corral-dev/corral/internal/boltfile"
	"github.com/corral-dev/corral/internal/errdefs"
)

var (
	boltRecords = []byte("records")
	boltMeta    = []byte("meta")
	boltRevKey  = []byte("rev")
)

// BoltStore is the single-node Store: one bbolt file of its own (IAM
// records must be durable, while the node's sandbox state is written
// without fsync). Each value is stored behind an 8-byte revision; the store
// keeps one counter, so revisions grow across keys as etcd's do.
type BoltStore struct {
	db *bolt.DB
}

var _ Store = (*BoltStore)(nil)

// OpenBolt opens (creating if needed) the store at path. Every Txn is
// fsynced before it returns.
func OpenBolt(path string) (*BoltStore, error) {
	db, err := boltfile.Open(path, "iam store", false, boltRecords, boltMeta)
	if err != nil {
		return nil, err
	}
	return &BoltStore{db: db}, nil
}

func decodeBolt(raw []byte) (value []byte, rev int64) {
	if len(raw) < 8 {
		return nil, 0
	}
	return bytes.Clone(raw[8:]), int64(binary.BigEndian.Uint64(raw[:8]))
}

func (s *BoltStore) Get(_ context.Context, key string) ([]byte, int64, error) {
	var value []byte
	var rev int64
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(boltRecords).Get([]byte(key))
		if raw == nil {
			return errdefs.NotFound("iam record %s: not found", key)
		}
		value, rev = decodeBolt(raw)
		return nil
	})
	return value, rev, err
}

func (s *BoltStore) List(_ context.Context, prefix string) ([]Entry, error) {
	var out []Entry
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(boltRecords).Cursor()
		p := []byte(prefix)
		for k, raw := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, raw = c.Next() {
			v, rev := decodeBolt(raw)
			out = append(out, Entry{Key: string(k), Value: v, Rev: rev})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list iam records %s: %w", prefix, err)
	}
	return out, nil
}

func (s *BoltStore) Txn(ctx context.Context, conds []Cond, writes []Write) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		records := tx.Bucket(boltRecords)
		for _, c := range conds {
			_, rev := decodeBolt(records.Get([]byte(c.Key)))
			if rev != c.Rev {
				return fmt.Errorf("iam record %s: at revision %d, not %d: %w", c.Key, rev, c.Rev, errdefs.ErrFailedPrecondition)
			}
		}
		meta := tx.Bucket(boltMeta)
		var next int64 = 1
		if v := meta.Get(boltRevKey); len(v) == 8 {
			next = int64(binary.BigEndian.Uint64(v)) + 1
		}
		revBytes := binary.BigEndian.AppendUint64(nil, uint64(next))
		for _, w := range writes {
			if w.Key == "" {
				return errdefs.InvalidArgument("iam record: empty key")
			}
			var err error
			if w.Delete {
				err = records.Delete([]byte(w.Key))
			} else {
				err = records.Put([]byte(w.Key), append(bytes.Clone(revBytes), w.Value...))
			}
			if err != nil {
				return fmt.Errorf("iam record %s: %w", w.Key, err)
			}
		}
		return meta.Put(boltRevKey, revBytes)
	})
}

// Close closes the store.
func (s *BoltStore) Close() error { return s.db.Close() }
