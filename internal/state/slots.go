package state

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Claim gives owner the lowest free slot below n, or the one it holds
// (userns.Slots: the node's host uid ranges). Free slots are found by
// walking the taken ones in order up to the first gap.
func (db *DB) Claim(owner string, n int) (int, error) {
	var slot int
	err := db.bolt.Update(func(tx *bolt.Tx) error {
		byOwner, bySlot := tx.Bucket(bucketSlots), tx.Bucket(bucketSlotOwners)
		if v := byOwner.Get([]byte(owner)); len(v) == 4 {
			slot = int(binary.BigEndian.Uint32(v))
			return nil
		}
		slot = 0
		c := bySlot.Cursor()
		for k, _ := c.First(); len(k) == 4 && int(binary.BigEndian.Uint32(k)) == slot; k, _ = c.Next() {
			slot++
		}
		if slot >= n {
			return errdefs.ResourceExhausted("all %d id ranges are in use", n)
		}
		key := binary.BigEndian.AppendUint32(nil, uint32(slot))
		if err := byOwner.Put([]byte(owner), key); err != nil {
			return err
		}
		return bySlot.Put(key, []byte(owner))
	})
	if err != nil {
		return 0, fmt.Errorf("claim id range slot: %w", err)
	}
	return slot, nil
}

// Free releases owner's slot; no-op if it holds none.
func (db *DB) Free(owner string) error {
	err := db.bolt.Update(func(tx *bolt.Tx) error {
		byOwner := tx.Bucket(bucketSlots)
		v := byOwner.Get([]byte(owner))
		if v == nil {
			return nil
		}
		if err := tx.Bucket(bucketSlotOwners).Delete(v); err != nil {
			return err
		}
		return byOwner.Delete([]byte(owner))
	})
	if err != nil {
		return fmt.Errorf("free id range slot of %s: %w", owner, err)
	}
	return nil
}

// Owners lists the owners holding a slot.
func (db *DB) Owners() ([]string, error) {
	var out []string
	err := db.bolt.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSlots).ForEach(func(k, _ []byte) error {
			out = append(out, string(k))
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list id range slots: %w", err)
	}
	return out, nil
}
