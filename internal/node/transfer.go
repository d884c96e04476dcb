package node

import (
	"context"
	"io"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// trees returns sb's tree copier, or a NotSupported error naming the way
// round it.
func trees(sb backend.Sandbox) (backend.Trees, error) {
	t, ok := sb.(backend.Trees)
	if !ok {
		return nil, errdefs.NotSupported("not supported: copying directory trees on this sandbox's backend (container, and vm images with corral-agent); copy single files, or pipe a tar through exec with streamed stdin")
	}
	return t, nil
}

// CopyIn extracts a tar stream into directory dir of sandbox id.
func (n *Node) CopyIn(ctx context.Context, id, dir string, r io.Reader) (entries, bytes int64, err error) {
	_, err = withSandbox(ctx, n, id, func(sb backend.Sandbox) (struct{}, error) {
		t, err := trees(sb)
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
		t, err := trees(sb)
		if err == nil {
			err = t.CopyOut(ctx, path, w)
		}
		return struct{}{}, err
	})
	return err
}
