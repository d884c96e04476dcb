package safefs

import (
	"context"

	"golang.org/x/sys/unix"
)

// Chown changes the owner of path (a symlink itself, not its target) to
// uid:gid as the caller sees ids. Files on kernel pseudo filesystems are
// refused.
func (f *FS) Chown(ctx context.Context, p string, uid, gid uint32) error {
	parent, name, p, err := f.openEntryParent(ctx, p, "the root's owner cannot be changed")
	if err != nil {
		return err
	}
	defer parent.Close()
	if err := unix.Fchownat(int(parent.Fd()), name, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathErr(p, "chown", err)
	}
	return nil
}
