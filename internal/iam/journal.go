package iam

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// The audit journal: an append-only file of audit entries in front of the
// store. A batch of concurrent entries costs one write and one fdatasync
// (a bbolt transaction costs two syncs and page writes); the entries move
// into the store in one transaction now and then (compaction), after which
// the journal is emptied. Each record is a 4-byte length, a 4-byte CRC-32C
// of the payload (both little-endian) and the payload: the entry as the
// store keeps it (JSON). A later record of the same key (BeginRecord's
// rewrite) replaces the earlier one.

// Compaction thresholds: the journal is compacted when it holds this many
// entries or bytes, after journalIdle without entries, and at close.
const (
	maxJournalEntries = 4096
	maxJournalBytes   = 4 << 20
)

// maxJournalRecord bounds one record's payload; a longer length is a torn
// or corrupt record.
const maxJournalRecord = 1 << 20

const journalHeader = 8

var journalCRC = crc32.MakeTable(crc32.Castagnoli)

// AuditJournal is the audit log's append-only journal (see OpenAuditJournal).
// Only its Service writes it: one process, one journal, one store.
type AuditJournal struct {
	f    *os.File
	path string
	size int64 // bytes written since the last truncation
	// broken: a write or sync failed, so what follows the last good record
	// is unknown; every later write fails.
	broken error
}

// OpenAuditJournal opens (creating if needed) the journal at path and
// replays it into st: the entries it holds, a torn last record dropped,
// are written to st in one transaction, then the journal is emptied. Pass
// it in Config.Journal; the Service closes it.
func OpenAuditJournal(path string, st Store, log *slog.Logger) (*AuditJournal, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("audit journal dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open audit journal: %w", err)
	}
	j := &AuditJournal{f: f, path: path}
	if err := j.replay(st, log); err != nil {
		f.Close()
		return nil, err
	}
	return j, nil
}

func (j *AuditJournal) replay(st Store, log *slog.Logger) error {
	raw, err := io.ReadAll(j.f)
	if err != nil {
		return fmt.Errorf("read audit journal %s: %w", j.path, err)
	}
	entries, good := decodeJournal(raw)
	if good < len(raw) {
		log.Warn("audit journal: dropped a torn last record (never acknowledged)", "path", j.path, "bytes", len(raw)-good)
	}
	if len(entries) > 0 {
		if err := st.Txn(context.Background(), nil, journalWrites(entries)); err != nil {
			return fmt.Errorf("replay audit journal %s: %w", j.path, err)
		}
		log.Info("audit journal: replayed", "path", j.path, "entries", len(entries))
	}
	if len(raw) > 0 {
		return j.truncate()
	}
	return nil
}

// decodeJournal returns the entries of raw's whole records, in order, and
// the length of raw they take: it stops at the first record that is short
// or fails its checksum (a write torn by a crash; no later record was
// acknowledged, since each batch is synced before its callers are answered).
func decodeJournal(raw []byte) ([]AuditEntry, int) {
	var out []AuditEntry
	off := 0
	for len(raw)-off >= journalHeader {
		n := int(binary.LittleEndian.Uint32(raw[off:]))
		sum := binary.LittleEndian.Uint32(raw[off+4:])
		if n == 0 || n > maxJournalRecord || len(raw)-off-journalHeader < n {
			break
		}
		payload := raw[off+journalHeader : off+journalHeader+n]
		if crc32.Checksum(payload, journalCRC) != sum {
			break
		}
		var e AuditEntry
		if err := json.Unmarshal(payload, &e); err != nil || !strings.HasPrefix(e.Key, auditPrefix) {
			break
		}
		out = append(out, e)
		off += journalHeader + n
	}
	return out, off
}

// appendJournalRecord appends value's record to buf.
func appendJournalRecord(buf, value []byte) []byte {
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(value)))
	buf = binary.LittleEndian.AppendUint32(buf, crc32.Checksum(value, journalCRC))
	return append(buf, value...)
}

// append writes buf (whole records) and syncs it: durable when it returns
// nil.
func (j *AuditJournal) append(buf []byte) error {
	if j.broken != nil {
		return j.broken
	}
	_, err := j.f.Write(buf)
	if err == nil {
		err = unix.Fdatasync(int(j.f.Fd()))
	}
	if err != nil {
		// After a failed sync the kernel may have dropped the pages: the
		// file's tail is unknown, so nothing more is appended after it.
		j.broken = fmt.Errorf("audit journal %s: %w", j.path, err)
		return j.broken
	}
	j.size += int64(len(buf))
	return nil
}

// truncate empties the journal durably: its entries are in the store.
func (j *AuditJournal) truncate() error {
	if err := j.f.Truncate(0); err != nil {
		return fmt.Errorf("truncate audit journal %s: %w", j.path, err)
	}
	if err := unix.Fdatasync(int(j.f.Fd())); err != nil {
		return fmt.Errorf("sync audit journal %s: %w", j.path, err)
	}
	j.size = 0
	return nil
}

// Close closes the file (the Service compacts it first).
func (j *AuditJournal) Close() error { return j.f.Close() }

// latestEntries folds entries (in journal order) to one per key: a final
// result wins over "started", whichever came first.
func latestEntries(entries []AuditEntry) map[string]AuditEntry {
	latest := make(map[string]AuditEntry, len(entries))
	for _, e := range entries {
		if prev, ok := latest[e.Key]; !ok || prev.Result == AuditStarted {
			latest[e.Key] = e
		}
	}
	return latest
}

// journalWrites is the store transaction that holds entries. Keys are
// written unconditionally: a replay after a compaction whose truncation
// was lost writes the same values again.
func journalWrites(entries []AuditEntry) []Write {
	latest := latestEntries(entries)
	writes := make([]Write, 0, len(latest))
	for _, e := range latest {
		val, _ := json.Marshal(e)
		writes = append(writes, Write{Key: e.Key, Value: val})
	}
	slices.SortFunc(writes, func(a, b Write) int { return strings.Compare(a.Key, b.Key) })
	return writes
}

// commitJournal appends batch to the journal in one write and one sync,
// makes it visible to listings, and answers each entry.
func (s *Service) commitJournal(batch []auditWrite) {
	var buf []byte
	for _, w := range batch {
		buf = appendJournalRecord(buf, w.value)
	}
	err := s.journal.append(buf)
	if err == nil {
		s.pendMu.Lock()
		for _, w := range batch {
			s.pending = append(s.pending, w.entry)
		}
		s.pendMu.Unlock()
	}
	for _, w := range batch {
		if err == nil && !w.quiet {
			s.publish(w.entry)
		}
		w.done <- err
	}
}

// journalFull says the journal has reached a compaction threshold.
func (s *Service) journalFull() bool {
	return len(s.pending) >= maxJournalEntries || s.journal.size >= maxJournalBytes
}

// compactJournal moves the journal's entries into the store in one
// transaction, then empties it. Listings read the entries from memory
// until the transaction has committed (see pendingAudit). On failure the
// entries stay in the journal (and in memory) for the next attempt or the
// next start. Only the audit writer calls it, so no entry is appended
// meanwhile.
func (s *Service) compactJournal() error {
	if len(s.pending) == 0 {
		return nil
	}
	if err := s.store.Txn(context.Background(), nil, journalWrites(s.pending)); err != nil {
		return fmt.Errorf("compact audit journal: %w", err)
	}
	s.pendMu.Lock()
	s.pending = nil
	s.pendMu.Unlock()
	return s.journal.truncate()
}

// pendingAudit is a snapshot of the journal's entries not yet in the store,
// then the results the writer holds (see resultHold): a listing shows the
// result of a call already answered, not yet durable. The writer only
// appends to s.pending (elements below a snapshot's length never change) or
// replaces it after a compaction has committed.
func (s *Service) pendingAudit() []AuditEntry {
	s.pendMu.Lock()
	defer s.pendMu.Unlock()
	if len(s.held) == 0 {
		return s.pending
	}
	out := slices.Clip(s.pending)
	for _, w := range s.held {
		out = append(out, w.entry)
	}
	return out
}

// setHeld sets the results the writer holds, which listings show; their
// commit (which appends them to s.pending) comes before they leave.
func (s *Service) setHeld(held []auditWrite) {
	s.pendMu.Lock()
	defer s.pendMu.Unlock()
	s.held = held
}

// mergePending overlays pending (taken before stored was read) on stored,
// in key order. An entry acknowledged before the snapshot is in one or
// both: it leaves pending only once its compaction has committed. Where
// both hold a key, a final result wins over "started".
func mergePending(stored, pending []AuditEntry) []AuditEntry {
	if len(pending) == 0 {
		return stored
	}
	latest := latestEntries(pending)
	for i, e := range stored {
		if p, ok := latest[e.Key]; ok {
			if e.Result == AuditStarted {
				stored[i] = p
			}
			delete(latest, e.Key)
		}
	}
	if len(latest) == 0 {
		return stored
	}
	for _, e := range latest {
		stored = append(stored, e)
	}
	slices.SortFunc(stored, func(a, b AuditEntry) int { return strings.Compare(a.Key, b.Key) })
	return stored
}
