package safefs

import (
	"context"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// maxDepth bounds a recursive Remove: each level holds one fd.
const maxDepth = 512

// Remove removes the file, symlink (never its target) or empty directory at
// path; with recursive, a directory and everything below it. The walk never
// follows a symlink (symlinks are unlinked, a symlink swapped in for a
// directory mid-walk is unlinked too) and does not descend into other
// mounts below path (like rm --one-file-system): such a mount point is
// reported and left. Removing "/" is refused.
func (f *FS) Remove(ctx context.Context, p string, recursive bool) error {
	parent, name, p, err := f.openEntryParent(ctx, p, "the root cannot be removed")
	if err != nil {
		return err
	}
	defer parent.Close()
	if err := checkNotMount(parent, name, p); err != nil {
		return err
	}
	err = unix.Unlinkat(int(parent.Fd()), name, 0)
	if err != unix.EISDIR {
		return unlinkErr(p, err)
	}
	err = unix.Unlinkat(int(parent.Fd()), name, unix.AT_REMOVEDIR)
	if !recursive || (err != unix.ENOTEMPTY && err != unix.EEXIST) {
		return unlinkErr(p, err)
	}
	return removeDir(ctx, parent, name, p, 0, false)
}

// unlinkErr maps an unlink error; nil stays nil.
func unlinkErr(p string, err error) error {
	if err == nil {
		return nil
	}
	return pathErr(p, "remove", err)
}

// removeEntry removes name (sandbox path p) from dir, whatever it is.
// Something already gone counts as removed.
func removeEntry(ctx context.Context, dir *os.File, name, p string, depth int) error {
	if err := checkNotMount(dir, name, p); err != nil {
		return err
	}
	err := unix.Unlinkat(int(dir.Fd()), name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR {
		return pathErr(p, "remove", err)
	}
	return removeDir(ctx, dir, name, p, depth, true)
}

// removeDir empties and removes the directory name in parent. The
// directory is opened by name with O_NOFOLLOW, so a symlink raced in for it
// is never entered.
func removeDir(ctx context.Context, parent *os.File, name, p string, depth int, sameMount bool) error {
	if depth >= maxDepth {
		return errdefs.ResourceExhausted("path %q: tree deeper than %d levels; remove it with exec", p, maxDepth)
	}
	dir, err := openChild(parent, name, unix.O_RDONLY|unix.O_DIRECTORY, sameMount)
	switch err {
	case nil:
	case unix.ENOENT:
		return nil
	case unix.ELOOP, unix.ENOTDIR:
		// Swapped for a symlink or file since we looked: unlink that.
		return unlinkErr(p, ignoreNotExist(unix.Unlinkat(int(parent.Fd()), name, 0)))
	default:
		return pathErr(p, "open", err)
	}
	err = removeEntries(ctx, dir, p, depth)
	dir.Close()
	if err != nil {
		return err
	}
	return unlinkErr(p, ignoreNotExist(unix.Unlinkat(int(parent.Fd()), name, unix.AT_REMOVEDIR)))
}

// removeEntries removes everything in dir. Entries are removed while
// getdents iterates; a final pass from the start makes sure none was
// skipped.
func removeEntries(ctx context.Context, dir *os.File, p string, depth int) error {
	buf := make([]byte, 32<<10)
	removed := false
	for {
		if err := live(ctx); err != nil {
			return err
		}
		n, err := unix.Getdents(int(dir.Fd()), buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return pathErr(p, "getdents", err)
		}
		if n <= 0 {
			if !removed {
				return nil
			}
			if _, err := unix.Seek(int(dir.Fd()), 0, 0); err != nil {
				return pathErr(p, "rewind", err)
			}
			removed = false
			continue
		}
		_, _, names := unix.ParseDirent(buf[:n], -1, nil)
		for _, name := range names {
			if err := removeEntry(ctx, dir, name, path.Join(p, name), depth+1); err != nil {
				return err
			}
			removed = true
		}
	}
}

// checkNotMount refuses when name in dir is the root of a mount (a
// directory or a bind-mounted file). The sandbox cannot mount, so the
// answer cannot change before the unlink that follows.
func checkNotMount(dir *os.File, name, p string) error {
	var stx unix.Statx_t
	err := unix.Statx(int(dir.Fd()), name, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_MNT_ID, &stx)
	if err == unix.ENOENT {
		return nil // the unlink reports it, or it is already gone
	}
	if err != nil {
		return pathErr(p, "statx", err)
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return errdefs.NotSupported("not supported: telling mount points apart (needs STATX_ATTR_MOUNT_ROOT, Linux 5.8+)")
	}
	if stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return errdefs.FailedPrecondition("path %q: is a mount point; not removed", p)
	}
	return nil
}

func ignoreNotExist(err error) error {
	if err == unix.ENOENT {
		return nil
	}
	return err
}
