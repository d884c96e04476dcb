package container

import (
	"context"
	"io"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime/userns"
	"github.com/corral-dev/corral/internal/safefs"
)

var _ backend.Trees = (*sandbox)(nil)

// CopyIn implements backend.Trees as the sandbox's root (see WriteFile),
// giving each entry the host id its recorded owner maps to.
func (s *sandbox) CopyIn(ctx context.Context, dir string, r io.Reader) (entries, bytes int64, err error) {
	opts := safefs.TarOptions{Owner: func(uid, gid int) (int, int, error) {
		for _, id := range []int{uid, gid} {
			if id < 0 || id >= int(s.ids.Size) {
				return 0, 0, errdefs.InvalidArgument("owner %d:%d: outside the sandbox's ids 0..%d", uid, gid, s.ids.Size-1)
			}
		}
		return int(s.ids.Host) + uid, int(s.ids.Host) + gid, nil
	}, Run: func(fn func() error) error { return userns.AsRoot(s.ids, fn) }}
	err = userns.AsRoot(s.ids, func() (err error) {
		entries, bytes, err = s.FS.Extract(ctx, dir, r, opts)
		return err
	})
	return entries, bytes, err
}

// CopyOut implements backend.Trees with owners as the sandbox sees them.
func (s *sandbox) CopyOut(ctx context.Context, p string, w io.Writer) error {
	return s.FS.Archive(ctx, p, w, safefs.TarOptions{Owner: func(uid, gid int) (int, int, error) {
		return int(s.ids.Inside(uint32(uid))), int(s.ids.Inside(uint32(gid))), nil
	}})
}
