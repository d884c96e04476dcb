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
	case unix.ENOSPC, unix.EDQUOT, unix.EFBIG:
		return errdefs.ResourceExhausted("path %q: %s (disk quota)", p, errno.Error())
	case unix.ENOSYS:
		return errdefs.NotSupported("not supported: %s on path %q (needs openat2, Linux 5.6+)", op, p)
	}
	if c, ok := errnoClasses[errno]; ok {
		return c.class("path %q: %s", p, c.what)
	}
	return fmt.Errorf("path %q: %s: %w", p, op, err)
}

// errnoClasses are the errnos whose message is the path and what went wrong.
var errnoClasses = map[unix.Errno]struct {
	class func(format string, args ...any) error
	what  string
}{
	unix.ENOENT:       {errdefs.NotFound, "no such file or directory"},
	unix.EEXIST:       {errdefs.AlreadyExists, "already exists"},
	unix.ENOTDIR:      {errdefs.InvalidArgument, "not a directory (or a parent is not)"},
	unix.EISDIR:       {errdefs.InvalidArgument, "is a directory"},
	unix.ENOTEMPTY:    {errdefs.FailedPrecondition, "directory not empty (remove it recursively)"},
	unix.ELOOP:        {errdefs.InvalidArgument, "too many symbolic links, or a /proc magic link"},
	unix.ENAMETOOLONG: {errdefs.InvalidArgument, "a name is too long"},
	unix.ENXIO:        {errdefs.InvalidArgument, "not a regular file"},
	unix.ENODEV:       {errdefs.InvalidArgument, "not a regular file"},
	unix.EXDEV:        {errdefs.FailedPrecondition, "crosses a mount point"},
	unix.EBUSY:        {errdefs.FailedPrecondition, "busy (a mount point?)"},
	unix.ETXTBSY:      {errdefs.FailedPrecondition, "a running program's file"},
	unix.EACCES:       {errdefs.PermissionDenied, "permission denied"},
	unix.EPERM:        {errdefs.PermissionDenied, "permission denied"},
	unix.EROFS:        {errdefs.PermissionDenied, "read-only file system"},
}
