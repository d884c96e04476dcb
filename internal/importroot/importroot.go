// Package importroot owns the one place where an API request may name a
// path on the node (layer create, image import of oci:DIR and
// docker-archive:FILE): only under the directory `corral serve
// --import-root` names, resolved with openat2 RESOLVE_BENEATH so that no
// ".." or symlink leads out of it, and read through the fds it resolved
// (a directory walked one name at a time from its parent's fd). Who may
// name such paths at all (the node administrator) is the caller's check.
// It imports errdefs and safefs; it must not import the API, control or
// server packages.
package importroot

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/safefs"
)

// Flag is the serve flag that sets the root, named in errors.
const Flag = "--import-root"

// Root is the directory node paths must lie under; a nil *Root refuses
// every node path.
type Root struct{ dir string }

// New returns the root dir (absolute; symlinks in it resolved now, once),
// or nil for "".
func New(dir string) (*Root, error) {
	if dir == "" {
		return nil, nil
	}
	if !filepath.IsAbs(dir) {
		return nil, errdefs.InvalidArgument("%s: %q must be an absolute path", Flag, dir)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, errdefs.InvalidArgument("%s: %v", Flag, err)
	}
	if st, err := os.Stat(real); err != nil || !st.IsDir() {
		return nil, errdefs.InvalidArgument("%s: %s is not a directory", Flag, dir)
	}
	return &Root{dir: filepath.Clean(real)}, nil
}

// Dir is the root's resolved path ("" for nil).
func (r *Root) Dir() string {
	if r == nil {
		return ""
	}
	return r.dir
}

// Open resolves p (absolute and under the root, or relative to it) and
// opens it for reading; it must be a directory or a regular file. field
// names the request field in errors.
func (r *Root) Open(field, p string) (*os.File, error) {
	if r == nil {
		return nil, errdefs.FailedPrecondition("%s: %q is a path on the node, and this server reads none (start it with %s DIR to allow paths under DIR, for the node administrator only); send the content from the client instead", field, p, Flag)
	}
	if p == "" || strings.IndexByte(p, 0) >= 0 {
		return nil, errdefs.InvalidArgument("%s: empty or NUL in the path", field)
	}
	rel := p
	if filepath.IsAbs(p) {
		var ok bool
		if rel, ok = strings.CutPrefix(p, r.dir+"/"); !ok && p != r.dir {
			return nil, errdefs.PermissionDenied("%s: %q is not under the import root %s", field, p, r.dir)
		}
		if p == r.dir {
			rel = "."
		}
	}
	root, err := os.OpenFile(r.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: open import root: %w", field, err)
	}
	defer root.Close()
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NOCTTY | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	}
	var fd int
	for i := 0; ; i++ {
		fd, err = unix.Openat2(int(root.Fd()), rel, &how)
		if (err == unix.EAGAIN || err == unix.EINTR) && i < 64 {
			continue
		}
		break
	}
	switch err {
	case nil:
	case unix.EXDEV:
		return nil, errdefs.PermissionDenied("%s: %q leads out of the import root %s (through \"..\" or a symlink)", field, p, r.dir)
	case unix.ELOOP:
		return nil, errdefs.PermissionDenied("%s: %q goes through a /proc magic link or too many symlinks", field, p)
	case unix.ENOENT, unix.ENOTDIR:
		return nil, errdefs.NotFound("%s: %q: no such file or directory under the import root", field, p)
	default:
		return nil, fmt.Errorf("%s: open %q: %w", field, p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: fstat %q: %w", field, p, err)
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFDIR && t != unix.S_IFREG {
		f.Close()
		return nil, errdefs.InvalidArgument("%s: %q is neither a directory nor a regular file", field, p)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// IsDir reports whether an opened node path is a directory.
func IsDir(f *os.File) bool {
	var st unix.Stat_t
	return unix.Fstat(int(f.Fd()), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
}

// Tar returns a tar stream of the opened directory dir's tree, every entry
// and xattr kept (it is the administrator's own tree), and takes
// ownership of dir. Closing the reader stops the walk.
func Tar(ctx context.Context, dir *os.File) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		defer dir.Close()
		err := safefs.ArchiveAt(ctx, dir, ".", ".", pw, safefs.TarOptions{Xattr: func(string) bool { return true }})
		pw.CloseWithError(err)
	}()
	return pr
}
