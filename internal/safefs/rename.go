package safefs

import (
	"context"
	"path"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Rename moves from to to (replacing a file there, like rename(2)). Both
// parents are resolved inside the root; neither name may be a mount point
// nor on a kernel pseudo filesystem. A symlink at from is moved, not
// followed.
func (f *FS) Rename(ctx context.Context, from, to string) error {
	from, err := cleanPath(from)
	if err != nil {
		return err
	}
	to, err = cleanPath(to)
	if err != nil {
		return errdefs.InvalidArgument("destination: %v", err)
	}
	if from == "/" || to == "/" {
		return errdefs.InvalidArgument("path: the root cannot be renamed")
	}
	if err := live(ctx); err != nil {
		return err
	}
	src, srcName, err := f.openDataParent(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, dstName, err := f.openDataParent(to)
	if err != nil {
		return err
	}
	defer dst.Close()
	if err := checkNotMount(src, srcName, from); err != nil {
		return err
	}
	if err := checkNotMount(dst, dstName, to); err != nil {
		return err
	}
	if err := unix.Renameat(int(src.Fd()), srcName, int(dst.Fd()), dstName); err != nil {
		if err == unix.ENOENT {
			if _, serr := f.Stat(ctx, from); serr != nil {
				return serr
			}
			return pathErr(path.Dir(to), "rename", err)
		}
		return pathErr(from, "rename to "+to, err)
	}
	return nil
}
