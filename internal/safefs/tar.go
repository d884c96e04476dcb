package safefs

import (
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// TarOptions map owners and filter extended attributes between a tree and
// a tar stream.
type TarOptions struct {
	// Owner maps ids: in Archive from the file's (as the FS sees them) to
	// the ones recorded, in Extract from the recorded ones to the file's.
	// An error refuses the entry. nil keeps ids as they are.
	Owner func(uid, gid int) (int, int, error)
	// Xattr says whether an extended attribute is copied; nil copies
	// user.* only (trusted.* would steer overlayfs, security.* grants
	// file capabilities or labels).
	Xattr func(name string) bool
	// Run runs each of Extract's file writers (for the credentials the
	// calling thread has, e.g. userns.AsRoot); nil runs them as they are.
	Run func(fn func() error) error
}

func (o TarOptions) owner(uid, gid int) (int, int, error) {
	if o.Owner == nil {
		return uid, gid, nil
	}
	return o.Owner(uid, gid)
}

func (o TarOptions) xattr(name string) bool {
	if o.Xattr == nil {
		return strings.HasPrefix(name, "user.")
	}
	return o.Xattr(name)
}

const paxXattr = "SCHILY.xattr."

// openName opens the single entry name of dir without following a
// symlink there (O_NOFOLLOW; O_CREAT|O_EXCL never follows one either).
// For one name no openat2 scope is needed: it has no "/" and is not "..",
// so it can only be an entry of dir; and plain openat stays fast while
// the host's mount table churns, which scoped openat2 lookups do not
// (they fall off the lockless path walk, ~0.5 ms a call here).
func openName(dir *os.File, name string, flags int, mode uint32) (*os.File, error) {
	if name == "" || name == ".." || strings.ContainsRune(name, '/') {
		return nil, unix.EINVAL
	}
	for {
		fd, err := unix.Openat(int(dir.Fd()), name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		return os.NewFile(uintptr(fd), name), nil
	}
}

func readlinkat(dir *os.File, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(int(dir.Fd()), name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}
