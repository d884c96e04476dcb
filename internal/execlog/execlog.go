// Package execlog keeps each sandbox's log of commands that carried an
// idempotency key (key, sequence number, argv, result, the first part of
// the output) in a bbolt file of its own on the node's disk, so that a
// repeated key finds its recorded result after a trainer's or the
// daemon's restart. It stores what the node hands it and must not import
// the node, control or backend packages.
package execlog

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/corral-dev/corral/internal/boltfile"
	"github.com/corral-dev/corral/internal/errdefs"
)

// State is where a logged command is.
type State string

const (
	Running State = "running"
	Done    State = "done"
	// Failed: the node could not run it to its end (Error says why).
	Failed State = "failed"
	// Lost: the node restarted while it ran; its outcome is unknown.
	Lost State = "lost"
)

// Chunk is a piece of output; Stream is the backend's stream number.
type Chunk struct {
	Stream int    `json:"s"`
	Data   []byte `json:"d"`
}

// Result is how a command ended (a copy of the backend's result, so this
// package imports no backend).
type Result struct {
	ExitCode  int           `json:"exit_code"`
	Signal    int           `json:"signal,omitempty"`
	TimedOut  bool          `json:"timed_out,omitempty"`
	OOMKilled bool          `json:"oom_killed,omitempty"`
	Truncated bool          `json:"truncated,omitempty"`
	Duration  time.Duration `json:"duration"`
}

// Entry is one logged command. Output lives apart (Output), so listing
// the log reads no output.
type Entry struct {
	Seq   uint64   `json:"seq"`
	Key   string   `json:"key"`
	Argv  []string `json:"argv"`
	Shell bool     `json:"shell,omitempty"`
	// Digest identifies the whole request (argv, env, cwd, user, stdin),
	// so a key reused for another command is refused.
	Digest string `json:"digest"`
	State  State  `json:"state"`
	Result Result `json:"result"`
	// Error and ErrorClass (an errdefs class name) for Failed and Lost.
	Error           string    `json:"error,omitempty"`
	ErrorClass      string    `json:"error_class,omitempty"`
	StartedAt       time.Time `json:"started_at"`
	EndedAt         time.Time `json:"ended_at,omitzero"`
	OutputBytes     int64     `json:"output_bytes,omitempty"`
	OutputKeptBytes int64     `json:"output_kept_bytes,omitempty"`
}

// Log is the node's exec log.
type Log struct {
	bolt *bolt.DB
}

var (
	bucketEntries = []byte("entries") // seq (big-endian) -> Entry
	bucketKeys    = []byte("keys")    // key -> seq
	bucketOutput  = []byte("output")  // seq -> []Chunk
)

// Open opens (creating if needed) the log at path. Like the node's state,
// writes are not fsynced: they survive a daemon kill (the page cache
// keeps them); a host crash may lose the latest, as it loses the
// sandboxes themselves.
func Open(path string) (*Log, error) {
	b, err := boltfile.Open(path, "exec log", true)
	if err != nil {
		return nil, err
	}
	return &Log{bolt: b}, nil
}

// Close closes the log.
func (l *Log) Close() error { return l.bolt.Close() }

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

// decodeLost decodes an entry; one still Running is made Lost at now, for
// why, and wasRunning says so.
func decodeLost(v []byte, now time.Time, why string) (e Entry, wasRunning bool, err error) {
	if err := json.Unmarshal(v, &e); err != nil {
		return e, false, err
	}
	if e.State == Running {
		e.State, e.EndedAt, e.ErrorClass, e.Error = Lost, now, "failed_precondition", why
		return e, true, nil
	}
	return e, false, nil
}

// sandboxBuckets opens sandbox's bucket and its entries, keys and output
// buckets, making those missing.
func sandboxBuckets(tx *bolt.Tx, sandbox string) (*bolt.Bucket, [3]*bolt.Bucket, error) {
	var buckets [3]*bolt.Bucket
	sb, err := tx.CreateBucketIfNotExists([]byte(sandbox))
	if err != nil {
		return nil, buckets, err
	}
	for i, name := range [][]byte{bucketEntries, bucketKeys, bucketOutput} {
		if buckets[i], err = sb.CreateBucketIfNotExists(name); err != nil {
			return nil, buckets, err
		}
	}
	return sb, buckets, nil
}

// Begin looks key up in sandbox's log: when it is there, Begin returns
// that entry and true; otherwise it logs e as Running under the next
// sequence number and returns it with false. maxEntries bounds the log.
func (l *Log) Begin(sandbox string, e Entry, maxEntries int) (Entry, bool, error) {
	var out Entry
	var found bool
	err := l.bolt.Update(func(tx *bolt.Tx) error {
		sb, buckets, err := sandboxBuckets(tx, sandbox)
		if err != nil {
			return err
		}
		entries, keys := buckets[0], buckets[1]
		if seq := keys.Get([]byte(e.Key)); seq != nil {
			found = true
			return json.Unmarshal(entries.Get(seq), &out)
		}
		if n := keys.Stats().KeyN; n >= maxEntries {
			return errdefs.ResourceExhausted("exec log of sandbox %s: %d keyed commands is the limit", sandbox, maxEntries)
		}
		seq, err := sb.NextSequence()
		if err != nil {
			return err
		}
		e.Seq, e.State = seq, Running
		v, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if err := keys.Put([]byte(e.Key), seqKey(seq)); err != nil {
			return err
		}
		out = e
		return entries.Put(seqKey(seq), v)
	})
	if err != nil {
		return Entry{}, false, fmt.Errorf("exec log of sandbox %s: key %q: %w", sandbox, e.Key, err)
	}
	return out, found, nil
}

// Finish records how a Running entry ended, with the output kept of it.
func (l *Log) Finish(sandbox string, e Entry, output []Chunk) error {
	err := l.bolt.Update(func(tx *bolt.Tx) error {
		sb := tx.Bucket([]byte(sandbox))
		if sb == nil {
			return nil // the sandbox was deleted meanwhile
		}
		v, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if err := sb.Bucket(bucketEntries).Put(seqKey(e.Seq), v); err != nil {
			return err
		}
		if len(output) == 0 {
			return nil
		}
		out, err := json.Marshal(output)
		if err != nil {
			return err
		}
		return sb.Bucket(bucketOutput).Put(seqKey(e.Seq), out)
	})
	if err != nil {
		return fmt.Errorf("exec log of sandbox %s: finish seq %d: %w", sandbox, e.Seq, err)
	}
	return nil
}

// Output returns the output kept of entry seq.
func (l *Log) Output(sandbox string, seq uint64) ([]Chunk, error) {
	var out []Chunk
	err := l.bolt.View(func(tx *bolt.Tx) error {
		sb := tx.Bucket([]byte(sandbox))
		if sb == nil {
			return nil
		}
		v := sb.Bucket(bucketOutput).Get(seqKey(seq))
		if v == nil {
			return nil
		}
		return json.Unmarshal(v, &out)
	})
	if err != nil {
		return nil, fmt.Errorf("exec log of sandbox %s: output of seq %d: %w", sandbox, seq, err)
	}
	return out, nil
}

// Since returns at most limit entries of sandbox with a sequence number
// above since, oldest first, and whether more follow.
func (l *Log) Since(sandbox string, since uint64, limit int) ([]Entry, bool, error) {
	var out []Entry
	more := false
	err := l.bolt.View(func(tx *bolt.Tx) error {
		sb := tx.Bucket([]byte(sandbox))
		if sb == nil {
			return nil
		}
		c := sb.Bucket(bucketEntries).Cursor()
		for k, v := c.Seek(seqKey(since + 1)); k != nil; k, v = c.Next() {
			if len(out) == limit {
				more = true
				return nil
			}
			var e Entry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("decode seq %d: %w", binary.BigEndian.Uint64(k), err)
			}
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("exec log of sandbox %s: %w", sandbox, err)
	}
	return out, more, nil
}

// Drop removes sandbox's whole log; a missing log is not an error.
func (l *Log) Drop(sandbox string) error {
	err := l.bolt.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket([]byte(sandbox)); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("drop exec log of sandbox %s: %w", sandbox, err)
	}
	return nil
}

// Recover runs once at the node's start, before any exec: it drops the
// logs of sandboxes keep rejects (gone while the daemon was down) and
// marks every entry still Running as Lost, because no process of the
// previous daemon reports to this one.
func (l *Log) Recover(keep func(sandbox string) bool, now time.Time) (dropped, lost int, err error) {
	err = l.bolt.Update(func(tx *bolt.Tx) error {
		var gone [][]byte
		err := tx.ForEach(func(name []byte, sb *bolt.Bucket) error {
			if !keep(string(name)) {
				gone = append(gone, append([]byte(nil), name...))
				return nil
			}
			entries := sb.Bucket(bucketEntries)
			if entries == nil {
				return nil
			}
			var running [][]byte
			var fixed []Entry
			err := entries.ForEach(func(k, v []byte) error {
				e, wasRunning, err := decodeLost(v, now, "the node restarted while it ran; its outcome is unknown")
				if wasRunning {
					running = append(running, append([]byte(nil), k...))
					fixed = append(fixed, e)
				}
				return err
			})
			if err != nil {
				return err
			}
			for i, k := range running {
				v, err := json.Marshal(fixed[i])
				if err != nil {
					return err
				}
				if err := entries.Put(k, v); err != nil {
					return err
				}
			}
			lost += len(running)
			return nil
		})
		if err != nil {
			return err
		}
		for _, name := range gone {
			if err := tx.DeleteBucket(name); err != nil {
				return err
			}
		}
		dropped = len(gone)
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("recover exec log: %w", err)
	}
	return dropped, lost, nil
}
