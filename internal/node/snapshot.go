package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/state"
)

// SnapshotOfLabel marks a sandbox restored from a snapshot with its id.
const SnapshotOfLabel = "corral.restored-from"

// snapshotRecordFile is a snapshot's record in its dir, written last: a
// dir without it is a snapshot that never completed.
const snapshotRecordFile = "snapshot.json"

var snapshotIDPattern = regexp.MustCompile(`^snap-[0-9a-f]{16}$`)

// SnapshotInfo describes a snapshot: the whole state of a sandbox at one
// instant (memory, devices, writable disk), kept in
// <data-dir>/snapshots/<id>/ until deleted.
type SnapshotInfo struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandbox_id"`
	Project   string    `json:"project,omitempty"`
	Backend   string    `json:"backend"`
	Bytes     int64     `json:"bytes"`
	CreatedAt time.Time `json:"created_at"`
	// Source is the sandbox's record at the snapshot: a restore makes a
	// sandbox with its image, resources and settings.
	Source state.Record `json:"source"`
	// Incoming marks a migration's copy on its target (ImportSnapshot): it
	// lives until AdoptSnapshot, and a start finds it half-used, so the
	// start removes it (its files were not synced).
	Incoming bool `json:"incoming,omitempty"`
}

// snapshots are the node's completed snapshots, by id.
type snapshots struct {
	mu   sync.Mutex
	byID map[string]*SnapshotInfo
	// making and makingBytes are the snapshots being written, admitted
	// under the node's limits (reserveSnapshot).
	making      int
	makingBytes int64
}

func (n *Node) snapshotRoot() string { return filepath.Join(n.cfg.DataDir, "snapshots") }

// loadSnapshots reads the snapshot records and removes what a crash left
// half-written; the layers of every snapshot are pinned for it.
func (n *Node) loadSnapshots() error {
	n.snaps.byID = map[string]*SnapshotInfo{}
	ents, err := os.ReadDir(n.snapshotRoot())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("snapshots: %w", err)
	}
	for _, e := range ents {
		dir := filepath.Join(n.snapshotRoot(), e.Name())
		raw, err := os.ReadFile(filepath.Join(dir, snapshotRecordFile))
		var info SnapshotInfo
		if err == nil {
			err = json.Unmarshal(raw, &info)
		}
		if err == nil && info.Incoming {
			err = errors.New("a migration's copy, whose migration ended with the daemon")
		}
		if err != nil || info.ID != e.Name() {
			n.log.Info("removing snapshot that never completed", "snapshot", e.Name(), "err", err)
			if err := os.RemoveAll(dir); err != nil {
				return fmt.Errorf("snapshots: remove %s: %w", e.Name(), err)
			}
			continue
		}
		n.snaps.byID[info.ID] = &info
		n.cfg.Images.Pin(info.ID, imageLayers(info.Source.Layers))
	}
	return nil
}

// Snapshot saves sandbox id's memory, devices and writable disk while it
// keeps running (a paused one is resumed first, as for any request). It
// is written to disk and synced before the record that makes it visible.
func (n *Node) Snapshot(ctx context.Context, id string) (*SnapshotInfo, error) {
	e, err := n.lookup(id)
	if err != nil {
		return nil, err
	}
	return n.snapshotEntry(ctx, e, id, nil)
}

// snapshotEntry is Snapshot of e; with own (a migration's fence of e) the
// sandbox is paused right after the snapshot and stays so.
func (n *Node) snapshotEntry(ctx context.Context, e *entry, id string, own *fence) (*SnapshotInfo, error) {
	sb, err := n.acquireEntry(ctx, e, id, own)
	if err != nil {
		return nil, err
	}
	defer e.release()
	rec := e.snapshot()
	ss, ok := sb.(backend.Snapshotter)
	if !ok {
		return nil, snapshotRefusal(rec.Backend)
	}
	if in := e.inflight.Load(); in > 1 {
		return nil, errdefs.FailedPrecondition("sandbox %s: %d other calls are in flight; a snapshot restarts the agent's session, which would cut them (retry once they end)", id, in-1)
	}
	release, err := n.reserveSnapshot(rec.MemoryBytes)
	if err != nil {
		return nil, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	defer release()
	snapID, dir, err := n.newSnapshotDir()
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	info := &SnapshotInfo{ID: snapID, SandboxID: id, Project: rec.Project, Backend: rec.Backend, Source: *rec}
	info.Source.BackendRecord = nil
	err = func() error {
		if info.Bytes, err = ss.SnapshotTo(ctx, dir); err != nil {
			return err
		}
		if own != nil {
			if err := n.fencePause(ctx, e, own); err != nil {
				return err
			}
		}
		info.CreatedAt = time.Now()
		if err := syncTree(dir); err != nil {
			return fmt.Errorf("snapshot %s: sync: %w", snapID, err)
		}
		return writeFileSync(filepath.Join(dir, snapshotRecordFile), info)
	}()
	if err != nil {
		if rerr := os.RemoveAll(dir); rerr != nil {
			n.log.Error("remove failed snapshot", "snapshot", snapID, "err", rerr)
		}
		return nil, err
	}
	n.cfg.Images.Pin(snapID, imageLayers(info.Source.Layers))
	n.snaps.mu.Lock()
	n.snaps.byID[snapID] = info
	n.snaps.mu.Unlock()
	n.log.Info("snapshot taken", "sandbox", id, "snapshot", snapID, "bytes", info.Bytes)
	return info, nil
}

// snapshotRefusal says why a sandbox of backendName cannot be snapshotted.
func snapshotRefusal(backendName string) error {
	if backendName == "container" {
		return errdefs.NotSupported("not supported: snapshot of a container sandbox: live checkpoints of container processes need CRIU, and %s", criuStatus())
	}
	return errdefs.NotSupported("not supported: snapshot of a %s sandbox", backendName)
}

var criuOnce = sync.OnceValue(func() string {
	bin, err := exec.LookPath("criu")
	if err != nil {
		return "criu not installed"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "check").CombinedOutput()
	if err == nil {
		return "criu check passes, but checkpoints through CRIU are not built yet"
	}
	for _, line := range strings.Split(string(out), "\n") {
		// Its helpers' "exited, status=1" lines come first and say nothing.
		if strings.Contains(line, "Error") && !strings.Contains(line, "exited, status=") {
			return "criu check fails: " + strings.TrimSpace(line)
		}
	}
	return fmt.Sprintf("criu check fails: %v", err)
})

// criuStatus is what `criu check` says on this node (run once).
func criuStatus() string { return criuOnce() }

// newSnapshotDir makes the directory of a new snapshot, named by a fresh
// random id.
func (n *Node) newSnapshotDir() (id, dir string, err error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	id = "snap-" + hex.EncodeToString(b)
	dir = filepath.Join(n.snapshotRoot(), id)
	if err := os.MkdirAll(n.snapshotRoot(), 0o700); err != nil {
		return "", "", err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", "", err
	}
	return id, dir, nil
}

// lookupSnapshot returns snapshot id if visible accepts its project.
func (n *Node) lookupSnapshot(id string, visible func(string) bool) (*SnapshotInfo, error) {
	if !snapshotIDPattern.MatchString(id) {
		return nil, errdefs.InvalidArgument("snapshot_id: %q is not a snapshot id (want snap-<16 hex>)", truncate(id))
	}
	n.snaps.mu.Lock()
	info, ok := n.snaps.byID[id]
	n.snaps.mu.Unlock()
	if !ok || (visible != nil && !visible(info.Project)) {
		return nil, errdefs.NotFound("snapshot %s not found", id)
	}
	return info, nil
}

// ListSnapshots lists the snapshots of projects visible accepts (nil:
// all), oldest first.
func (n *Node) ListSnapshots(_ context.Context, visible func(string) bool) []*SnapshotInfo {
	n.snaps.mu.Lock()
	out := make([]*SnapshotInfo, 0, len(n.snaps.byID))
	for _, s := range n.snaps.byID {
		if visible == nil || visible(s.Project) {
			out = append(out, s)
		}
	}
	n.snaps.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// DeleteSnapshot removes a snapshot's record and files; sandboxes
// restored from it are not affected (they have their own copies).
func (n *Node) DeleteSnapshot(_ context.Context, id string, visible func(string) bool) error {
	info, err := n.lookupSnapshot(id, visible)
	if err != nil {
		return err
	}
	n.snaps.mu.Lock()
	delete(n.snaps.byID, id)
	n.snaps.mu.Unlock()
	dir := filepath.Join(n.snapshotRoot(), info.ID)
	// The record goes first: a crash mid-removal leaves a dir the next
	// start removes.
	if err := os.Remove(filepath.Join(dir, snapshotRecordFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	n.cfg.Images.Release(id)
	return nil
}

// Restore makes a new sandbox from snapshot id, in the snapshot's project
// and under its quota, with the source's image, resources and settings,
// its labels overlaid with labels (plus SnapshotOfLabel), and a fresh
// identity: a new id, agent secret, hostname and (were it networked)
// network slot.
func (n *Node) Restore(ctx context.Context, id string, labels map[string]string, visible func(string) bool) (*Sandbox, error) {
	l := maps.Clone(labels)
	if l == nil {
		l = map[string]string{}
	}
	l[SnapshotOfLabel] = id
	return n.restore(ctx, id, l, visible)
}

// restore is Restore with labels laid over the source's as they are.
func (n *Node) restore(ctx context.Context, id string, labels map[string]string, visible func(string) bool) (*Sandbox, error) {
	info, err := n.lookupSnapshot(id, visible)
	if err != nil {
		return nil, err
	}
	src := info.Source
	l := maps.Clone(src.Labels)
	if l == nil {
		l = map[string]string{}
	}
	maps.Copy(l, labels)
	idle, life := src.IdleTimeout, src.MaxLifetime
	return n.Create(ctx, CreateRequest{
		Project: src.Project, Backend: src.Backend, Image: src.Image,
		Resources: Resources{CPUMillis: src.CPUMillis, MemoryBytes: src.MemoryBytes, DiskBytes: src.DiskBytes,
			Pids: src.Pids, BestEffort: src.BestEffort, IO: src.IO},
		Env: src.Env, Workdir: src.Workdir, User: src.User, Labels: l,
		IdleTimeout: &idle, MaxLifetime: &life, IdleAction: src.IdleAction, Fresh: src.Fresh,
		Network:     backend.Network{Mode: src.NetworkMode, Allow: src.NetworkAllow},
		restoreFrom: filepath.Join(n.snapshotRoot(), info.ID),
	})
}

// makeSandbox is the backend half of Create: a new sandbox, or one
// restored from the snapshot dir req.restoreFrom.
func makeSandbox(ctx context.Context, b backend.Backend, req CreateRequest, spec backend.Spec) (backend.Sandbox, error) {
	if req.restoreFrom == "" {
		return b.Create(ctx, spec)
	}
	r, ok := b.(backend.Restorer)
	if !ok {
		return nil, errdefs.NotSupported("not supported: restore into a %s sandbox", b.Name())
	}
	return r.Restore(ctx, spec, req.restoreFrom)
}

// forkFromSnapshot forks a sandbox whose backend snapshots: one snapshot,
// then count restores of it (each with its own disk copy; the backend
// shares what it can of the memory), then the snapshot goes.
func (n *Node) forkFromSnapshot(ctx context.Context, id string, count int, labels map[string]string) (*ForkResult, error) {
	snap, err := n.Snapshot(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	defer func() {
		if err := n.DeleteSnapshot(context.WithoutCancel(ctx), snap.ID, nil); err != nil {
			n.log.Error("remove a fork's snapshot", "snapshot", snap.ID, "err", err)
		}
	}()
	out := &ForkResult{Snapshot: snap.ID, ProcessesCarried: true, Forks: make([]Fork, count)}
	makeForks(id, out.Forks, func() (*Sandbox, error) {
		// Labelled as forks only: the snapshot goes once they are made.
		return n.restore(ctx, snap.ID, labels, nil)
	})
	return out, nil
}

// syncTree fsyncs every file under dir and dir itself, so that a
// snapshot survives a reboot of the node, not only a daemon crash.
func syncTree(dir string) error {
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return syncPath(p)
	})
	if err != nil {
		return err
	}
	return syncPath(dir)
}

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// writeFileSync writes v as JSON to path through a synced temporary file.
func writeFileSync(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncPath(filepath.Dir(path))
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
