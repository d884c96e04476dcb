package client

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// Files are file operations inside one sandbox. Paths are absolute inside
// the sandbox; nothing can resolve outside it.
type Files struct{ s *Sandbox }

// Files returns the sandbox's file operations.
func (s *Sandbox) Files() *Files { return &Files{s: s} }

// FileInfo describes a file in a sandbox.
type FileInfo struct {
	Name    string
	Path    string
	Size    int64
	Mode    fs.FileMode // permission bits
	IsDir   bool
	Symlink bool
	ModTime time.Time
	UID     uint32
	GID     uint32
}

func fileInfoFromProto(p *corralv1.FileInfo) FileInfo {
	return FileInfo{
		Name: p.Name, Path: p.Path, Size: p.Size, Mode: fs.FileMode(p.Mode),
		IsDir: p.IsDir, Symlink: p.IsSymlink, ModTime: p.ModifiedAt.AsTime(),
		UID: p.Uid, GID: p.Gid,
	}
}

// Write creates or replaces path with data (mode 0644, parents created).
func (f *Files) Write(ctx context.Context, path string, data []byte) error {
	_, err := f.WriteFrom(ctx, path, bytes.NewReader(data), 0)
	return err
}

// Read returns the whole file.
func (f *Files) Read(ctx context.Context, path string) ([]byte, error) {
	var buf bytes.Buffer
	_, err := f.ReadTo(ctx, path, &buf)
	return buf.Bytes(), err
}

// ReadTo streams the file into w and returns the bytes copied.
func (f *Files) ReadTo(ctx context.Context, path string, w io.Writer) (int64, error) {
	stream, err := f.s.c.bulk.ReadFile(ctx, connect.NewRequest(&corralv1.ReadFileRequest{SandboxId: f.s.id, Path: path}))
	if err != nil {
		return 0, wrapErr(err)
	}
	defer stream.Close()
	var total int64
	for stream.Receive() {
		n, err := w.Write(stream.Msg().Data)
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
	return total, wrapErr(stream.Err())
}

// List lists a directory.
func (f *Files) List(ctx context.Context, path string) ([]FileInfo, error) {
	resp, err := f.s.c.svc.ListDir(ctx, connect.NewRequest(&corralv1.ListDirRequest{SandboxId: f.s.id, Path: path}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return fromProtos(resp.Msg.Entries, fileInfoFromProto), nil
}

// Stat describes a file without following a final symlink.
func (f *Files) Stat(ctx context.Context, path string) (FileInfo, error) {
	resp, err := f.s.c.svc.Stat(ctx, connect.NewRequest(&corralv1.StatRequest{SandboxId: f.s.id, Path: path}))
	if err != nil {
		return FileInfo{}, wrapErr(err)
	}
	return fileInfoFromProto(resp.Msg.Info), nil
}

// Remove removes a file or an empty directory, or a whole tree if recursive.
func (f *Files) Remove(ctx context.Context, path string, recursive bool) error {
	_, err := f.s.c.svc.Remove(ctx, connect.NewRequest(&corralv1.RemoveRequest{SandboxId: f.s.id, Path: path, Recursive: recursive}))
	return wrapErr(err)
}

// MakeDir creates a directory (mode 0755), and its parents if asked.
func (f *Files) MakeDir(ctx context.Context, path string, parents bool) error {
	_, err := f.s.c.svc.MakeDir(ctx, connect.NewRequest(&corralv1.MakeDirRequest{SandboxId: f.s.id, Path: path, Parents: parents}))
	return wrapErr(err)
}
