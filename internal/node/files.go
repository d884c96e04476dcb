package node

import (
	"context"
	"io"
	"io/fs"
	"sync"

	"github.com/corral-dev/corral/internal/backend"
)

// withSandbox runs op on the live sandbox id, counting it as activity.
func withSandbox[T any](ctx context.Context, n *Node, id string, op func(backend.Sandbox) (T, error)) (T, error) {
	e, sb, err := n.acquire(ctx, id)
	if err != nil {
		var zero T
		return zero, err
	}
	defer e.release()
	return op(sb)
}

// WriteFile writes r to path inside the sandbox.
func (n *Node) WriteFile(ctx context.Context, id, path string, r io.Reader, opts backend.WriteOptions) (int64, error) {
	return withSandbox(ctx, n, id, func(sb backend.Sandbox) (int64, error) {
		return sb.WriteFile(ctx, path, r, opts)
	})
}

// ReadFile opens path inside the sandbox; the sandbox counts as busy until
// the reader is closed.
func (n *Node) ReadFile(ctx context.Context, id, path string, offset, limit int64) (io.ReadCloser, error) {
	e, sb, err := n.acquire(ctx, id)
	if err != nil {
		return nil, err
	}
	rc, err := sb.ReadFile(ctx, path, offset, limit)
	if err != nil {
		e.release()
		return nil, err
	}
	return &releasingReader{ReadCloser: rc, releaseOnce: releaseOnce{release: e.release}}, nil
}

// releaseOnce releases a sandbox acquired for a reader or connection at
// its first Close, however many follow.
type releaseOnce struct {
	once    sync.Once
	release func()
}

func (r *releaseOnce) done() { r.once.Do(r.release) }

type releasingReader struct {
	io.ReadCloser
	releaseOnce
}

func (r *releasingReader) Close() error {
	r.done()
	return r.ReadCloser.Close()
}

// ListDir lists a directory inside the sandbox.
func (n *Node) ListDir(ctx context.Context, id, path string) ([]backend.FileInfo, error) {
	return withSandbox(ctx, n, id, func(sb backend.Sandbox) ([]backend.FileInfo, error) {
		return sb.ListDir(ctx, path)
	})
}

// Stat describes a file inside the sandbox.
func (n *Node) Stat(ctx context.Context, id, path string) (backend.FileInfo, error) {
	return withSandbox(ctx, n, id, func(sb backend.Sandbox) (backend.FileInfo, error) {
		return sb.Stat(ctx, path)
	})
}

// Remove removes a file or directory inside the sandbox.
func (n *Node) Remove(ctx context.Context, id, path string, recursive bool) error {
	_, err := withSandbox(ctx, n, id, func(sb backend.Sandbox) (struct{}, error) {
		return struct{}{}, sb.Remove(ctx, path, recursive)
	})
	return err
}

// MakeDir creates a directory inside the sandbox.
func (n *Node) MakeDir(ctx context.Context, id, path string, mode fs.FileMode, parents bool) error {
	_, err := withSandbox(ctx, n, id, func(sb backend.Sandbox) (struct{}, error) {
		return struct{}{}, sb.MakeDir(ctx, path, mode, parents)
	})
	return err
}
