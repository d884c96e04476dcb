package safefs

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// pathErr maps a syscall error on path p to an errdefs class whose message
// names the path; op ("open", "unlink", ...) is kept for unclassed errors.
func pathErr(p, op string, err error) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("path %q: %s: %w", p, op, err)
	}
	switch errno {
	case unix.ENOENT:
		return errdefs.NotFound("path %q: no such file or directory", p)
	case unix.EEXIST:
		return errdefs.AlreadyExists("path %q: already exists", p)
	case unix.ENOTDIR:
		return errdefs.InvalidArgument("path %q: not a directory (or a parent is not)", p)
	case unix.EISDIR:
		return errdefs.InvalidArgument("path %q: is a directory", p)
	case unix.ENOTEMPTY:
		return errdefs.FailedPrecondition("path %q: directory not empty (remove it recursively)", p)
	case unix.ELOOP:
		return errdefs.InvalidArgument("path %q: too many symbolic links, or a /proc magic link", p)
	case unix.ENAMETOOLONG:
		return errdefs.InvalidArgument("path %q: a name is too long", p)
	case unix.ENXIO, unix.ENODEV:
		return errdefs.InvalidArgument("path %q: not a regular file", p)
	case unix.EXDEV:
		return errdefs.FailedPrecondition("path %q: crosses a mount point", p)
	case unix.EBUSY:
		return errdefs.FailedPrecondition("path %q: busy (a mount point?)", p)
	case unix.ETXTBSY:
		return errdefs.FailedPrecondition("path %q: a running program's file", p)
	case unix.EACCES, unix.EPERM:
		return errdefs.PermissionDenied("path %q: permission denied", p)
	case unix.EROFS:
		return errdefs.PermissionDenied("path %q: read-only file system", p)
	case unix.ENOSPC, unix.EDQUOT, unix.EFBIG:
		return errdefs.ResourceExhausted("path %q: %s (disk quota)", p, errno.Error())
	case unix.ENOSYS:
		return errdefs.NotSupported("not supported: %s on path %q (needs openat2, Linux 5.6+)", op, p)
	}
	return fmt.Errorf("path %q: %s: %w", p, op, err)
}
