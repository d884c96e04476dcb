// Package state keeps a node's sandbox records in bbolt on local disk, so a
// restarted daemon knows every sandbox it owned. It stores opaque records and
// must not import the node, control or backend packages.
package state

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/corral-dev/corral/internal/boltfile"
)

var (
	bucketSandboxes = []byte("sandboxes")
	bucketMeta      = []byte("meta")
	keyNodeID       = []byte("node_id")
	// bucketSlots maps an owner (sandbox id) to its id-range slot
	// (userns.Slots), bucketSlotOwners the slot (big-endian) back to it.
	bucketSlots      = []byte("idrange_slots")
	bucketSlotOwners = []byte("idrange_owners")
)

// Phase is where a sandbox is in its life. Creating records exist so that a
// crash in the middle of Create is cleaned up at the next start.
type Phase string

const (
	PhaseCreating Phase = "creating"
	PhaseRunning  Phase = "running"
	PhasePaused   Phase = "paused"
	PhaseStopped  Phase = "stopped"
)

// Record is everything the node keeps about one sandbox.
type Record struct {
	ID      string `json:"id"`
	Backend string `json:"backend"`
	// BackendID names the sandbox's resources in its backend (run dir,
	// cgroups, disk) when they are not named after ID: a recycled sandbox
	// keeps those of the sandbox it was first made as ("": ID).
	BackendID string `json:"backend_id,omitempty"`
	// Project is the IAM project the sandbox belongs to ("": the node
	// administrator's own).
	Project string `json:"project,omitempty"`
	Image   string `json:"image"`
	// Layers are the read-only layers the sandbox was made from, base
	// first: the image store keeps them while the record exists.
	Layers      []Layer           `json:"layers,omitempty"`
	Phase       Phase             `json:"phase"`
	CPUMillis   int64             `json:"cpu_millis"`
	MemoryBytes int64             `json:"memory_bytes"`
	DiskBytes   int64             `json:"disk_bytes"`
	Pids        int64             `json:"pids"`
	BestEffort  bool              `json:"best_effort,omitempty"`
	Env         []string          `json:"env,omitempty"`
	Workdir     string            `json:"workdir,omitempty"`
	User        string            `json:"user,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	IdleTimeout time.Duration     `json:"idle_timeout"`
	MaxLifetime time.Duration     `json:"max_lifetime"`
	CreatedAt   time.Time         `json:"created_at"`
	StoppedAt   time.Time         `json:"stopped_at,omitzero"`
	StopReason  string            `json:"stop_reason,omitempty"`
	// NetworkMode and NetworkAllow are the current network policy ("" is
	// mode none).
	NetworkMode  string   `json:"network_mode,omitempty"`
	NetworkAllow []string `json:"network_allow,omitempty"`
	// BackendRecord is the backend's own opaque record (backend.Sandbox.Record).
	BackendRecord []byte `json:"backend_record,omitempty"`
	// PauseAtEnd: when max_lifetime passes, the sandbox is paused (and
	// kept) instead of stopped.
	PauseAtEnd bool `json:"pause_at_end,omitempty"`
	// IdleAction is what idle_timeout does: "" or "stop", "pause", "reclaim".
	IdleAction string `json:"idle_action,omitempty"`
	// Fresh: made from scratch for its create and torn down by its delete,
	// never from or to a warm pool.
	Fresh bool `json:"fresh,omitempty"`
	// Reclaimed: paused with its memory pushed out of RAM, leaving
	// ReclaimedResident bytes in it (what admission counts until resumed).
	Reclaimed         bool  `json:"reclaimed,omitempty"`
	ReclaimedResident int64 `json:"reclaimed_resident,omitempty"`
	// IO is the sandbox's disk I/O limits as asked (zero: the node's).
	IO IOLimits `json:"io,omitzero"`
	// Deleting: Delete has answered (the sandbox's processes are dead) and
	// its teardown runs in the background; a restart finishes it.
	Deleting bool `json:"deleting,omitempty"`
}

// BackendName is the name the sandbox's backend knows it by.
func (r *Record) BackendName() string {
	if r.BackendID != "" {
		return r.BackendID
	}
	return r.ID
}

// IOLimits are disk I/O limits per second.
type IOLimits struct {
	ReadBPS   int64 `json:"read_bps,omitempty"`
	WriteBPS  int64 `json:"write_bps,omitempty"`
	ReadIOPS  int64 `json:"read_iops,omitempty"`
	WriteIOPS int64 `json:"write_iops,omitempty"`
}

// Layer is one read-only layer of a sandbox's image.
type Layer struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

// DB is the node's state database.
type DB struct {
	bolt *bolt.DB
}

// Open opens (creating if needed) the database at path.
//
// Writes are not fsynced: a daemon crash keeps them (they are in the page
// cache), and after a host crash the node's leftover sweep removes whatever
// a lost record described. That keeps Create off the disk's fsync latency.
func Open(path string) (*DB, error) {
	b, err := boltfile.Open(path, "state", true, bucketSandboxes, bucketMeta, bucketSlots, bucketSlotOwners)
	if err != nil {
		return nil, err
	}
	return &DB{bolt: b}, nil
}

// Close closes the database.
func (db *DB) Close() error { return db.bolt.Close() }

// NodeID returns this node's id, generating and storing one on first use.
func (db *DB) NodeID() (string, error) {
	var id string
	err := db.bolt.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		if v := b.Get(keyNodeID); v != nil {
			id = string(v)
			return nil
		}
		buf := make([]byte, 3)
		if _, err := rand.Read(buf); err != nil {
			return err
		}
		id = "n" + hex.EncodeToString(buf)
		return b.Put(keyNodeID, []byte(id))
	})
	return id, err
}

// Put stores rec, replacing any record with the same id.
func (db *DB) Put(rec *Record) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode record %s: %w", rec.ID, err)
	}
	return db.bolt.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Put([]byte(rec.ID), v)
	})
}

// Delete removes the record of id; deleting a missing record is not an error.
func (db *DB) Delete(id string) error {
	return db.bolt.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Delete([]byte(id))
	})
}

// All returns every record.
func (db *DB) All() ([]*Record, error) {
	var recs []*Record
	err := db.bolt.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).ForEach(func(k, v []byte) error {
			rec := new(Record)
			if err := json.Unmarshal(v, rec); err != nil {
				return fmt.Errorf("decode record %s: %w", k, err)
			}
			recs = append(recs, rec)
			return nil
		})
	})
	return recs, err
}
