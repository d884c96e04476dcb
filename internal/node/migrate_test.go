package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/execlog"
	"github.com/corral-dev/corral/internal/state"
	"github.com/corral-dev/corral/internal/storage/layers"
)

// pinImages counts pins; a migration's import pins the snapshot's layers.
type pinImages struct {
	Images
	pinned map[string]bool
}

func (p *pinImages) Pin(holder string, _ []layers.Layer) { p.pinned[holder] = true }
func (p *pinImages) Release(holder string)               { delete(p.pinned, holder) }

// restoringBackend is a backend that restores (only its name is used).
type restoringBackend struct{ backend.Backend }

func (restoringBackend) Name() string { return "microvm" }
func (restoringBackend) Restore(context.Context, backend.Spec, string) (backend.Sandbox, error) {
	return nil, errors.New("not in this test")
}

func migrationNode(t *testing.T, id string) *Node {
	n := &Node{id: id, cfg: Config{DataDir: t.TempDir(), Images: &pinImages{pinned: map[string]bool{}}},
		log: slog.New(slog.DiscardHandler), backends: map[string]backend.Backend{"microvm": restoringBackend{}}}
	n.snaps.byID = map[string]*SnapshotInfo{}
	var err error
	if n.execLog, err = execlog.Open(filepath.Join(n.cfg.DataDir, "execlog.db")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.execLog.Close() })
	return n
}

func recordOf(t *testing.T, info SnapshotInfo) []byte {
	b, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func chunkNames(chunks []SnapshotChunk) []string {
	var out []string
	for _, c := range chunks {
		if len(out) == 0 || out[len(out)-1] != c.Name {
			out = append(out, c.Name)
		}
	}
	return out
}

// feed returns a recv over chunks, then io.EOF (or end, when set).
func feed(chunks []SnapshotChunk, end error) func() (SnapshotChunk, error) {
	return func() (SnapshotChunk, error) {
		if len(chunks) == 0 {
			if end != nil {
				return SnapshotChunk{}, end
			}
			return SnapshotChunk{}, io.EOF
		}
		c := chunks[0]
		chunks = chunks[1:]
		return c, nil
	}
}

// TestSnapshotExportImport: a snapshot goes from one node to another
// with its holes kept (only data is sent), under a fresh snapshot id on
// the target, with its record last and its layers pinned there.
func TestSnapshotExportImport(t *testing.T) {
	src, dst := migrationNode(t, "nsrc01"), migrationNode(t, "ndst01")
	info := SnapshotInfo{ID: "snap-00000000000000aa", SandboxID: "nsrc01-0123456789ab", Backend: "microvm", Project: "p",
		Source: state.Record{ID: "nsrc01-0123456789ab", Backend: "microvm", Project: "p", Labels: map[string]string{"job": "x"}}}
	dir := filepath.Join(src.snapshotRoot(), info.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	mem := bytes.Repeat([]byte("m"), 3*chunkBytes+17)
	if err := os.WriteFile(filepath.Join(dir, "memory.snap"), mem, 0o600); err != nil {
		t.Fatal(err)
	}
	ram, err := os.Create(filepath.Join(dir, "ram.img"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ram.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := ram.WriteAt([]byte("page"), 32<<20); err != nil {
		t.Fatal(err)
	}
	ram.Close()
	if err := os.WriteFile(filepath.Join(dir, snapshotRecordFile), recordOf(t, info), 0o600); err != nil {
		t.Fatal(err)
	}
	src.snaps.byID[info.ID] = &info
	// Its exec log: one command done (with output), one still running.
	done, _, err := src.execLog.Begin(info.SandboxID, execlog.Entry{Key: "k1", Argv: []string{"true"}}, 10)
	if err != nil {
		t.Fatal(err)
	}
	done.State, done.Result.ExitCode = execlog.Done, 3
	if err := src.execLog.Finish(info.SandboxID, done, []execlog.Chunk{{Stream: 1, Data: []byte("out")}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := src.execLog.Begin(info.SandboxID, execlog.Entry{Key: "k2", Argv: []string{"sleep"}}, 10); err != nil {
		t.Fatal(err)
	}

	var chunks []SnapshotChunk
	sent := 0
	err = src.ExportSnapshot(t.Context(), info.ID, func(c SnapshotChunk) error {
		c.Data = bytes.Clone(c.Data)
		sent += len(c.Data)
		chunks = append(chunks, c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if last := chunks[len(chunks)-1]; last.Name != snapshotRecordFile {
		t.Errorf("last chunk is of %s, want the record", last.Name)
	}
	if sent > len(mem)+1<<20 {
		t.Errorf("%d bytes sent for %d of data: the RAM image's holes were sent", sent, len(mem))
	}
	got, err := dst.ImportSnapshot(t.Context(), feed(chunks, nil))
	if err != nil {
		t.Fatal(err)
	}
	if got.ID == info.ID || !snapshotIDPattern.MatchString(got.ID) || got.SandboxID != info.SandboxID || got.Source.Labels["job"] != "x" {
		t.Errorf("imported: %+v", got)
	}
	if names := chunkNames(chunks); strings.Join(names, " ") != "memory.snap ram.img execlog.json snapshot.json" {
		t.Errorf("files sent: %v", names)
	}
	// The exec log arrives with the adoption: the running command is
	// lost there (its end is not seen), the done one replays.
	if err := dst.importExecLog(filepath.Join(dst.snapshotRoot(), got.ID), info.SandboxID); err != nil {
		t.Fatal(err)
	}
	ents, _, err := dst.execLog.Since(info.SandboxID, 0, 10)
	if err != nil || len(ents) != 2 || ents[0].State != execlog.Done || ents[0].Result.ExitCode != 3 || ents[1].State != execlog.Lost {
		t.Errorf("exec log on the target: %+v, %v", ents, err)
	}
	if out, err := dst.execLog.Output(info.SandboxID, ents[0].Seq); err != nil || len(out) != 1 || string(out[0].Data) != "out" {
		t.Errorf("output on the target: %+v, %v", out, err)
	}
	if e, found, err := dst.execLog.Begin(info.SandboxID, execlog.Entry{Key: "k3"}, 10); err != nil || found || e.Seq != 3 {
		t.Errorf("next command on the target: %+v %v %v, want seq 3", e, found, err)
	}
	if _, err := dst.lookupSnapshot(got.ID, nil); err != nil || !dst.cfg.Images.(*pinImages).pinned[got.ID] {
		t.Errorf("imported snapshot not listed or not pinned: %v", err)
	}
	out := filepath.Join(dst.snapshotRoot(), got.ID)
	if b, err := os.ReadFile(filepath.Join(out, "memory.snap")); err != nil || !bytes.Equal(b, mem) {
		t.Errorf("memory.snap differs after the copy: %v", err)
	}
	fi, err := os.Stat(filepath.Join(out, "ram.img"))
	if err != nil || fi.Size() != 64<<20 {
		t.Fatalf("ram.img: %v %v", fi, err)
	}
	if blocks := fi.Sys().(*syscall.Stat_t).Blocks * 512; blocks > 1<<20 {
		t.Errorf("ram.img takes %d bytes on the target: not sparse", blocks)
	}
	var rec SnapshotInfo
	if b, err := os.ReadFile(filepath.Join(out, snapshotRecordFile)); err != nil || json.Unmarshal(b, &rec) != nil || rec.ID != got.ID || !rec.Incoming {
		t.Errorf("record on the target: %+v %v", rec, err)
	}
	// A start finds a migration's copy whose migration ended with the
	// daemon: it goes (its files were never synced).
	if err := dst.loadSnapshots(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) || len(dst.snaps.byID) != 0 {
		t.Errorf("a migration's copy survived a start: %v, %d listed", err, len(dst.snaps.byID))
	}
}

// TestSnapshotImportRefusals: a stream with a name that is not a plain
// file name, a file twice, data outside a file, no record, a record that
// does not match or names a backend that does not restore here, or a
// stream that breaks, is refused naming what is wrong, and leaves no
// snapshot dir behind.
func TestSnapshotImportRefusals(t *testing.T) {
	good := SnapshotInfo{ID: "snap-00000000000000bb", SandboxID: "nsrc01-0123456789ab", Backend: "microvm",
		Source: state.Record{ID: "nsrc01-0123456789ab", Backend: "microvm"}}
	rec := func(info SnapshotInfo) SnapshotChunk {
		b := recordOf(t, info)
		return SnapshotChunk{Name: snapshotRecordFile, Size: int64(len(b)), Data: b}
	}
	file := func(name string) SnapshotChunk { return SnapshotChunk{Name: name, Size: 4, Data: []byte("data")} }
	mismatched, container, unknown, badID := good, good, good, good
	mismatched.Source.ID = "nsrc01-ffffffffffff"
	badID.SandboxID, badID.Source.ID = "n1-../../../etc", "n1-../../../etc"
	container.Backend, container.Source.Backend = "container", "container"
	unknown.Backend, unknown.Source.Backend = "nosuch", "nosuch"
	for _, tc := range []struct {
		name   string
		chunks []SnapshotChunk
		end    error
		check  func(error) bool
		want   string
	}{
		{"dot dot", []SnapshotChunk{file(".."), rec(good)}, nil, errdefs.IsInvalidArgument, "name"},
		{"traversal", []SnapshotChunk{file("../../etc/x"), rec(good)}, nil, errdefs.IsInvalidArgument, "name"},
		{"absolute", []SnapshotChunk{file("/etc/passwd"), rec(good)}, nil, errdefs.IsInvalidArgument, "name"},
		{"subdir", []SnapshotChunk{file("a/b"), rec(good)}, nil, errdefs.IsInvalidArgument, "name"},
		{"hidden", []SnapshotChunk{file(".x"), rec(good)}, nil, errdefs.IsInvalidArgument, "name"},
		{"twice", []SnapshotChunk{file("a"), file("b"), file("a"), rec(good)}, nil, errdefs.IsInvalidArgument, "sent twice"},
		{"past the end", []SnapshotChunk{{Name: "a", Size: 4, Offset: 2, Data: []byte("data")}, rec(good)}, nil, errdefs.IsInvalidArgument, "offset"},
		{"negative offset", []SnapshotChunk{{Name: "a", Size: 4, Offset: -1, Data: []byte("d")}, rec(good)}, nil, errdefs.IsInvalidArgument, "offset"},
		{"size changes", []SnapshotChunk{file("a"), {Name: "a", Size: 8, Offset: 4, Data: []byte("more")}, rec(good)}, nil, errdefs.IsInvalidArgument, "offset"},
		{"huge", []SnapshotChunk{{Name: "a", Size: maxImportFileBytes + 1}, rec(good)}, nil, errdefs.IsInvalidArgument, "size"},
		{"no record", []SnapshotChunk{file("a")}, nil, errdefs.IsInvalidArgument, snapshotRecordFile},
		{"after the record", []SnapshotChunk{rec(good), file("a")}, nil, errdefs.IsInvalidArgument, "after the record"},
		{"bad record", []SnapshotChunk{{Name: snapshotRecordFile, Size: 3, Data: []byte("{{{")}}, nil, errdefs.IsInvalidArgument, snapshotRecordFile},
		{"mismatched record", []SnapshotChunk{file("a"), rec(mismatched)}, nil, errdefs.IsInvalidArgument, "source record"},
		{"bad sandbox id", []SnapshotChunk{file("a"), rec(badID)}, nil, errdefs.IsInvalidArgument, "sandbox id"},
		{"container", []SnapshotChunk{file("a"), rec(container)}, nil, errdefs.IsNotSupported, "container"},
		{"unknown backend", []SnapshotChunk{file("a"), rec(unknown)}, nil, errdefs.IsInvalidArgument, "backend"},
		{"broken stream", []SnapshotChunk{file("a")}, errors.New("stream reset"), func(err error) bool { return err != nil }, "stream reset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := migrationNode(t, "ndst01")
			_, err := n.ImportSnapshot(t.Context(), feed(tc.chunks, tc.end))
			if !tc.check(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("import: %v, want an error naming %q", err, tc.want)
			}
			if ents, _ := os.ReadDir(n.snapshotRoot()); len(ents) != 0 {
				t.Errorf("left behind: %v", ents)
			}
			if len(n.snaps.byID) != 0 || len(n.cfg.Images.(*pinImages).pinned) != 0 {
				t.Errorf("listed or pinned after a refusal")
			}
		})
	}
}
