package execlog

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Dump is a sandbox's whole log as it travels with the sandbox to another
// node (a migration).
type Dump struct {
	// Seq is the log's last sequence number.
	Seq     uint64  `json:"seq"`
	Entries []Entry `json:"entries"`
	// Output is the output kept, by sequence number.
	Output map[uint64][]Chunk `json:"output,omitempty"`
}

// Export returns sandbox's log (nil when it has none). An entry still
// running is exported Lost: its end is not seen on the other node, so its
// outcome is unknown there, as after a restart.
func (l *Log) Export(sandbox string, now time.Time) (*Dump, error) {
	var d *Dump
	err := l.bolt.View(func(tx *bolt.Tx) error {
		sb := tx.Bucket([]byte(sandbox))
		if sb == nil {
			return nil
		}
		d = &Dump{Seq: sb.Sequence(), Output: map[uint64][]Chunk{}}
		if err := sb.Bucket(bucketEntries).ForEach(func(_, v []byte) error {
			e, _, err := decodeLost(v, now, "it ran while the sandbox migrated to another node; its outcome is unknown")
			if err != nil {
				return err
			}
			d.Entries = append(d.Entries, e)
			return nil
		}); err != nil {
			return err
		}
		return sb.Bucket(bucketOutput).ForEach(func(k, v []byte) error {
			var out []Chunk
			if err := json.Unmarshal(v, &out); err != nil {
				return err
			}
			d.Output[binary.BigEndian.Uint64(k)] = out
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("export exec log of sandbox %s: %w", sandbox, err)
	}
	return d, nil
}

// Import makes d sandbox's log; a sandbox that has a log already is
// refused.
func (l *Log) Import(sandbox string, d *Dump) error {
	err := l.bolt.Update(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte(sandbox)) != nil {
			return errdefs.AlreadyExists("sandbox %s has an exec log here already", sandbox)
		}
		sb, buckets, err := sandboxBuckets(tx, sandbox)
		if err != nil {
			return err
		}
		entries, keys, output := buckets[0], buckets[1], buckets[2]
		for _, e := range d.Entries {
			if e.Seq == 0 || e.Seq > d.Seq || e.Key == "" {
				return errdefs.InvalidArgument("exec log: entry seq %d (key %q) is out of range (1 to %d, keyed)", e.Seq, e.Key, d.Seq)
			}
			v, err := json.Marshal(e)
			if err != nil {
				return err
			}
			if err := entries.Put(seqKey(e.Seq), v); err != nil {
				return err
			}
			if err := keys.Put([]byte(e.Key), seqKey(e.Seq)); err != nil {
				return err
			}
		}
		for seq, out := range d.Output {
			if seq == 0 || seq > d.Seq {
				return errdefs.InvalidArgument("exec log: output of seq %d is out of range (1 to %d)", seq, d.Seq)
			}
			v, err := json.Marshal(out)
			if err != nil {
				return err
			}
			if err := output.Put(seqKey(seq), v); err != nil {
				return err
			}
		}
		return sb.SetSequence(d.Seq)
	})
	if err != nil {
		return fmt.Errorf("import exec log of sandbox %s: %w", sandbox, err)
	}
	return nil
}
