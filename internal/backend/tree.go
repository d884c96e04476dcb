package backend

import (
	"context"
	"io"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Trees is implemented by sandboxes that copy whole trees in and out as
// tar streams (corral cp of a directory). Owners in the stream are as the
// sandbox sees them; nothing resolves outside the sandbox's root.
type Trees interface {
	// CopyIn extracts the tar stream r into directory dir (made when
	// missing) and returns the entries and content bytes written.
	CopyIn(ctx context.Context, dir string, r io.Reader) (entries, bytes int64, err error)
	// CopyOut writes a tar stream of path (its last element first, then
	// a directory's tree) to w.
	CopyOut(ctx context.Context, path string, w io.Writer) error
}

// TreesOf returns sb's tree copier, or a NotSupported error naming the
// way round it.
func TreesOf(sb Sandbox) (Trees, error) {
	t, ok := sb.(Trees)
	if !ok {
		return nil, errdefs.NotSupported("not supported: copying directory trees on this sandbox's backend (container, microvm, and vm images with corral-agent); copy single files, or pipe a tar through exec with streamed stdin")
	}
	return t, nil
}
