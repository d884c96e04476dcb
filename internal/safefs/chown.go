package safefs

import (
	"context"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Chown changes the owner of path (a symlink itself, not its target) to
// uid:gid as the caller sees ids. Files on kernel pseudo filesystems are
// refused.
func (f *FS) Chown(ctx context.Context, p string, uid, gid uint32) error {
	p, err := cleanPath(p)
	if err != nil {
		return err
	}
	if p == "/" {
		return errdefs.InvalidArgument("path %q: the root's owner cannot be changed", p)
	}
	if err := live(ctx); err != nil {
		return err
	}
	parent, name, err := f.openDataParent(p)
	if err != nil {
		return err
	}
	defer parent.Close()
	if err := unix.Fchownat(int(parent.Fd()), name, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathErr(p, "chown", err)
	}
	return nil
}
