package node

import (
	"context"
	"io"

	"github.com/corral-dev/corral/internal/backend"
)

// CopyIn extracts a tar stream into directory dir of sandbox id.
func (n *Node) CopyIn(ctx context.Context, id, dir string, r io.Reader) (entries, bytes int64, err error) {
	_, err = withSandbox(ctx, n, id, func(sb backend.Sandbox) (struct{}, error) {
		t, err := backend.TreesOf(sb)
		if err == nil {
			entries, bytes, err = t.CopyIn(ctx, dir, r)
		}
		return struct{}{}, err
	})
	return entries, bytes, err
}

// CopyOut writes a tar stream of path in sandbox id to w.
func (n *Node) CopyOut(ctx context.Context, id, path string, w io.Writer) error {
	_, err := withSandbox(ctx, n, id, func(sb backend.Sandbox) (struct{}, error) {
		t, err := backend.TreesOf(sb)
		if err == nil {
			err = t.CopyOut(ctx, path, w)
		}
		return struct{}{}, err
	})
	return err
}
