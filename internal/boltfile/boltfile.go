// Package boltfile opens the node's bbolt files (sandbox state, exec log,
// IAM store) one way: directory and file created 0700/0600, a lock another
// daemon holds reported as unavailable after two seconds, the top-level
// buckets made. It imports errdefs only; never the node, backends or API
// layers (internal/deptest).
package boltfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Open opens (creating if needed) the bbolt file at path with the given
// top-level buckets; what names it in errors ("state", "exec log"). With
// noSync writes are not fsynced (the caller says why that is safe).
func Open(path, what string, noSync bool, buckets ...[]byte) (*bolt.DB, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("%s dir: %w", what, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, NoSync: noSync})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, errdefs.Unavailable("%s %s is locked: is another corral serve using this --data-dir?", what, path)
		}
		return nil, fmt.Errorf("open %s %s: %w", what, path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range buckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init %s %s: %w", what, path, err)
	}
	return db, nil
}
