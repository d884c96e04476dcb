package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/execlog"
)

// A migration moves a snapshot between nodes as a stream of chunks
// (ExportSnapshot on the source, ImportSnapshot on the target) and
// restores it there under the source sandbox's id (AdoptSnapshot).

// SnapshotChunk is a piece of one file of a snapshot dir in transit: a
// chunk with a new Name starts that file (Size bytes, sparse), and Data
// lands at Offset.
type SnapshotChunk struct {
	Name   string
	Size   int64
	Offset int64
	Data   []byte
}

const (
	// chunkBytes is the data one chunk carries at most.
	chunkBytes = 1 << 20
	// maxImportFiles, maxImportFileBytes and maxRecordBytes bound what an
	// import accepts (a microVM snapshot has four files and its record).
	maxImportFiles     = 16
	maxImportFileBytes = 1 << 40
	maxRecordBytes     = 1 << 20
	// maxExecLogBytes bounds the exec log a migration carries.
	maxExecLogBytes = 256 << 20
	// execLogFile carries the sandbox's exec log in a migration's copy.
	execLogFile = "execlog.json"
)

// snapshotFileName is what a file of a snapshot dir may be called: a
// plain name, so that nothing an import writes lands outside its dir.
var snapshotFileName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// migratedID is what the id of a sandbox from another node may be (the
// form newID makes): it names the sandbox's run dir and disks here.
var migratedID = regexp.MustCompile(`^[A-Za-z0-9]{1,64}-[0-9a-f]{1,32}$`)

// Has reports whether sandbox id is one of this node's (also one migrated
// here, whose id names the node it was made on).
func (n *Node) Has(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.sandboxes[id]
	return ok
}

// ExportSnapshot sends snapshot id's files through send, the data extents
// only (holes stay holes on the other side), its record last.
func (n *Node) ExportSnapshot(ctx context.Context, id string, send func(SnapshotChunk) error) error {
	info, err := n.lookupSnapshot(id, nil)
	if err != nil {
		return err
	}
	dir := filepath.Join(n.snapshotRoot(), info.ID)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("export snapshot %s: %w", id, err)
	}
	var names []string
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return fmt.Errorf("export snapshot %s: %s is not a regular file", id, e.Name())
		}
		if e.Name() != snapshotRecordFile {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	buf := make([]byte, chunkBytes)
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := exportFile(filepath.Join(dir, name), name, buf, send); err != nil {
			return fmt.Errorf("export snapshot %s: %s: %w", id, name, err)
		}
	}
	// The exec log travels beside the snapshot, as it is now.
	if err := n.exportExecLog(info.SandboxID, send); err != nil {
		return fmt.Errorf("export snapshot %s: %w", id, err)
	}
	if err := exportFile(filepath.Join(dir, snapshotRecordFile), snapshotRecordFile, buf, send); err != nil {
		return fmt.Errorf("export snapshot %s: %s: %w", id, snapshotRecordFile, err)
	}
	return nil
}

// exportExecLog sends sandbox's exec log as the file execLogFile (nothing
// when it has none).
func (n *Node) exportExecLog(sandbox string, send func(SnapshotChunk) error) error {
	d, err := n.execLog.Export(sandbox, time.Now())
	if err != nil || d == nil {
		return err
	}
	raw, err := json.Marshal(d)
	if err != nil {
		return err
	}
	if len(raw) > maxExecLogBytes {
		return errdefs.FailedPrecondition("the exec log of sandbox %s is %d bytes, more than a migration carries (%d)", sandbox, len(raw), maxExecLogBytes)
	}
	size := int64(len(raw))
	if err := send(SnapshotChunk{Name: execLogFile, Size: size}); err != nil {
		return err
	}
	for off := 0; off < len(raw); off += chunkBytes {
		if err := send(SnapshotChunk{Name: execLogFile, Size: size, Offset: int64(off), Data: raw[off:min(len(raw), off+chunkBytes)]}); err != nil {
			return err
		}
	}
	return nil
}

// importExecLog makes the exec log that came with snapshot dir the log of
// sandbox (nothing when none came).
func (n *Node) importExecLog(dir, sandbox string) error {
	raw, err := readBounded(filepath.Join(dir, execLogFile), maxExecLogBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("exec log: %w", err)
	}
	var d execlog.Dump
	if err := json.Unmarshal(raw, &d); err != nil {
		return errdefs.InvalidArgument("%s: %v", execLogFile, err)
	}
	if len(d.Entries) > maxLoggedExecs {
		return errdefs.InvalidArgument("%s: %d entries, at most %d", execLogFile, len(d.Entries), maxLoggedExecs)
	}
	return n.execLog.Import(sandbox, &d)
}

// readBounded reads path when it has at most limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > limit {
		return nil, errdefs.InvalidArgument("%s: not a regular file of at most %d bytes", filepath.Base(path), limit)
	}
	return os.ReadFile(path)
}

// exportFile sends one file: a chunk naming it, then its data extents.
func exportFile(path, name string, buf []byte, send func(SnapshotChunk) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if err := send(SnapshotChunk{Name: name, Size: size}); err != nil {
		return err
	}
	for off := int64(0); off < size; {
		start, err := f.Seek(off, unix.SEEK_DATA)
		if errors.Is(err, syscall.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		end, err := f.Seek(start, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		for p := start; p < end; {
			k, err := f.ReadAt(buf[:min(int64(len(buf)), end-p)], p)
			if k > 0 {
				if err := send(SnapshotChunk{Name: name, Size: size, Offset: p, Data: buf[:k]}); err != nil {
					return err
				}
				p += int64(k)
			}
			if err != nil && !(errors.Is(err, io.EOF) && k > 0) {
				return fmt.Errorf("read at %d: %w", p, err)
			}
		}
		off = end
	}
	return nil
}

// ImportSnapshot writes the chunks recv returns (io.EOF ends them) into a
// new snapshot dir of this node, under a fresh snapshot id. Every file
// name is a plain name (snapshotFileName), written once, with data inside
// its declared size; the record must come and name a backend of this
// node that restores. A stream that breaks, or anything refused, leaves
// nothing: the dir goes, and it has no record until every file is written.
func (n *Node) ImportSnapshot(ctx context.Context, recv func() (SnapshotChunk, error)) (*SnapshotInfo, error) {
	snapID, dir, err := n.newSnapshotDir()
	if err != nil {
		return nil, fmt.Errorf("import snapshot: %w", err)
	}
	info, err := n.importInto(ctx, dir, snapID, recv)
	if err != nil {
		if rerr := os.RemoveAll(dir); rerr != nil {
			n.log.Error("remove failed snapshot import", "snapshot", snapID, "err", rerr)
		}
		return nil, fmt.Errorf("import snapshot: %w", err)
	}
	n.cfg.Images.Pin(snapID, imageLayers(info.Source.Layers))
	n.snaps.mu.Lock()
	n.snaps.byID[snapID] = info
	n.snaps.mu.Unlock()
	n.log.Info("snapshot imported", "snapshot", snapID, "sandbox", info.SandboxID, "bytes", info.Bytes)
	return info, nil
}

func (n *Node) importInto(ctx context.Context, dir, snapID string, recv func() (SnapshotChunk, error)) (*SnapshotInfo, error) {
	var (
		cur    *os.File
		name   string
		size   int64
		record []byte
		seen   = map[string]bool{}
	)
	closeCur := func() error {
		if cur == nil {
			return nil
		}
		err := cur.Close()
		cur = nil
		return err
	}
	defer closeCur()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c, err := recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if c.Name != name {
			if err := closeCur(); err != nil {
				return nil, err
			}
			switch {
			case !snapshotFileName.MatchString(c.Name):
				return nil, errdefs.InvalidArgument("name: %q is not a plain file name", truncate(c.Name))
			case seen[c.Name]:
				return nil, errdefs.InvalidArgument("name: %s sent twice", c.Name)
			case len(seen) == maxImportFiles:
				return nil, errdefs.InvalidArgument("name: more than %d files", maxImportFiles)
			case record != nil:
				return nil, errdefs.InvalidArgument("name: %s after the record (%s comes last)", c.Name, snapshotRecordFile)
			case c.Size < 0 || c.Size > maxImportFileBytes:
				return nil, errdefs.InvalidArgument("size: %d for %s is out of range (0 to %d)", c.Size, c.Name, int64(maxImportFileBytes))
			case c.Name == snapshotRecordFile && c.Size > maxRecordBytes:
				return nil, errdefs.InvalidArgument("size: %d for %s, at most %d", c.Size, c.Name, maxRecordBytes)
			}
			seen[c.Name], name, size = true, c.Name, c.Size
			if name == snapshotRecordFile {
				record = make([]byte, size)
			} else {
				// O_EXCL|O_NOFOLLOW in a dir made for this import: a new
				// regular file, never one that was there.
				if cur, err = os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600); err != nil {
					return nil, err
				}
				if err := cur.Truncate(size); err != nil {
					return nil, err
				}
			}
		}
		if c.Size != size || c.Offset < 0 || c.Offset > size-int64(len(c.Data)) {
			return nil, errdefs.InvalidArgument("offset: %d+%d bytes is outside %s (%d bytes)", c.Offset, len(c.Data), name, size)
		}
		if len(c.Data) == 0 {
			continue
		}
		if name == snapshotRecordFile {
			copy(record[c.Offset:], c.Data)
		} else if _, err := cur.WriteAt(c.Data, c.Offset); err != nil {
			return nil, err
		}
	}
	if err := closeCur(); err != nil {
		return nil, err
	}
	if record == nil {
		return nil, errdefs.InvalidArgument("name: the stream ended without %s", snapshotRecordFile)
	}
	info, err := n.checkImported(record)
	if err != nil {
		return nil, err
	}
	// Not synced: the copy lives for one migration, and a start removes
	// it (Incoming) rather than trust it.
	info.ID, info.Incoming = snapID, true
	if err := writeFileSync(filepath.Join(dir, snapshotRecordFile), info); err != nil {
		return nil, err
	}
	return info, nil
}

// checkImported decodes and checks a snapshot record from another node.
func (n *Node) checkImported(raw []byte) (*SnapshotInfo, error) {
	var info SnapshotInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		return nil, errdefs.InvalidArgument("%s: %v", snapshotRecordFile, err)
	}
	if !migratedID.MatchString(info.SandboxID) {
		return nil, errdefs.InvalidArgument("%s: sandbox id %q is not of the form <node>-<hex>", snapshotRecordFile, truncate(info.SandboxID))
	}
	if info.Source.ID != info.SandboxID || info.Source.Backend != info.Backend || info.Source.Project != info.Project {
		return nil, errdefs.InvalidArgument("%s: the source record (sandbox %q) does not match the snapshot's (sandbox %q)", snapshotRecordFile, truncate(info.Source.ID), info.SandboxID)
	}
	b, err := n.pickBackend(info.Backend)
	if err != nil {
		return nil, err
	}
	if _, ok := b.(backend.Restorer); !ok {
		return nil, errdefs.NotSupported("not supported: restore into a %s sandbox", b.Name())
	}
	info.Source.BackendRecord = nil
	return &info, nil
}

// AdoptSnapshot restores snapshot snapID into a sandbox that keeps the
// id, creation time, labels, project and settings of the sandbox it was
// taken of (sandboxID), with a fresh agent secret and network slot as in
// any restore, and the exec log that came with the snapshot. The
// snapshot is a migration's copy: it is removed afterwards, also when
// the restore fails.
func (n *Node) AdoptSnapshot(ctx context.Context, snapID, sandboxID string) (*Sandbox, error) {
	info, err := n.lookupSnapshot(snapID, nil)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := n.DeleteSnapshot(context.WithoutCancel(ctx), snapID, nil); err != nil {
			n.log.Error("remove a migration's snapshot", "snapshot", snapID, "err", err)
		}
	}()
	if info.SandboxID != sandboxID {
		return nil, errdefs.InvalidArgument("sandbox_id: snapshot %s is of sandbox %s, not %s", snapID, info.SandboxID, truncate(sandboxID))
	}
	if n.Has(sandboxID) {
		return nil, errdefs.AlreadyExists("sandbox %s is already on this node", sandboxID)
	}
	dir := filepath.Join(n.snapshotRoot(), info.ID)
	if err := n.importExecLog(dir, sandboxID); err != nil {
		return nil, fmt.Errorf("adopt sandbox %s: %w", sandboxID, err)
	}
	src := info.Source
	idle, life := src.IdleTimeout, src.MaxLifetime
	sb, err := n.Create(ctx, CreateRequest{
		Project: src.Project, Backend: src.Backend, Image: src.Image,
		Resources: Resources{CPUMillis: src.CPUMillis, MemoryBytes: src.MemoryBytes, DiskBytes: src.DiskBytes,
			Pids: src.Pids, BestEffort: src.BestEffort, IO: src.IO},
		Env: src.Env, Workdir: src.Workdir, User: src.User, Labels: maps.Clone(src.Labels),
		IdleTimeout: &idle, MaxLifetime: &life, IdleAction: src.IdleAction, Fresh: src.Fresh,
		Network:     backend.Network{Mode: src.NetworkMode, Allow: src.NetworkAllow},
		restoreFrom: dir,
		keepID:      sandboxID, createdAt: src.CreatedAt,
	})
	if err != nil {
		if derr := n.execLog.Drop(sandboxID); derr != nil {
			n.log.Error("drop the exec log of a failed adoption", "sandbox", sandboxID, "err", derr)
		}
		return nil, fmt.Errorf("adopt sandbox %s: %w", sandboxID, err)
	}
	return sb, nil
}
