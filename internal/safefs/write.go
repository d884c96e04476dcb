package safefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

const (
	defaultFileMode fs.FileMode = 0o644
	defaultDirMode  fs.FileMode = 0o755
	chunk                       = 1 << 20 // bytes copied between ctx checks
)

// WriteFile creates or truncates (or, with Append, appends to) the regular
// file at path and copies r into it, returning the bytes written. A symlink
// at path is followed inside the root. A new file gets opts.Mode (default
// 0644, umask ignored) and the FS owner; an existing file keeps both.
// Anything but a regular data file at path is refused without writing to
// it. On error the file may hold part of r.
func (f *FS) WriteFile(ctx context.Context, p string, r io.Reader, opts backend.WriteOptions) (int64, error) {
	p, err := cleanPath(p)
	if err != nil {
		return 0, err
	}
	mode, err := checkMode(opts.Mode, defaultFileMode, fs.ModePerm, "permission bits 0777")
	if err != nil {
		return 0, err
	}
	if p == "/" {
		return 0, errdefs.InvalidArgument("path %q: is a directory", p)
	}
	if err := live(ctx); err != nil {
		return 0, err
	}
	root, err := f.root()
	if err != nil {
		return 0, err
	}
	defer root.Close()
	if opts.MakeParents {
		if err := f.mkdirAll(ctx, root, path.Dir(p), defaultDirMode); err != nil {
			return 0, err
		}
	}
	file, err := f.openForWrite(root, p, opts.Append, mode)
	if err != nil {
		return 0, err
	}
	n, err := copyChunks(ctx, file, r, p)
	if cerr := file.Close(); cerr != nil && err == nil {
		err = pathErr(p, "close", cerr)
	}
	return n, err
}

// checkMode defaults a zero mode and refuses bits outside allowed (what
// names them for the error).
func checkMode(m, def, allowed fs.FileMode, what string) (fs.FileMode, error) {
	if m == 0 {
		return def, nil
	}
	if m&^allowed != 0 {
		return 0, errdefs.InvalidArgument("mode: only %s are allowed (got %v)", what, m)
	}
	return m, nil
}

// openForWrite opens p for writing, creating it when missing, and checks
// that it is a regular data file. O_NONBLOCK keeps a FIFO from blocking
// (without a reader the open fails with ENXIO), O_NOCTTY keeps a terminal
// from becoming ours; neither matters for a regular file.
func (f *FS) openForWrite(root *os.File, p string, appendTo bool, mode fs.FileMode) (*os.File, error) {
	flags := uint64(unix.O_WRONLY | unix.O_NONBLOCK | unix.O_NOCTTY)
	if appendTo {
		flags |= unix.O_APPEND
	} else {
		flags |= unix.O_TRUNC
	}
	created := true
	// O_EXCL tells a new file from an existing one, so that only a new
	// file gets mode and owner; it also refuses to follow a final symlink,
	// hence the second open for an existing path.
	file, err := at(root, p, flags|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err == unix.EEXIST {
		created = false
		file, err = at(root, p, flags, 0)
	}
	if err == unix.ENOENT && !created {
		// A dangling symlink (create its target) or a file just removed.
		created = true
		file, err = at(root, p, flags|unix.O_CREAT, 0o600)
	}
	if err != nil {
		return nil, pathErr(p, "open", err)
	}
	if err := checkRegular(file, p); err != nil {
		file.Close()
		return nil, err
	}
	if created {
		if err := f.setNew(file, p, mode); err != nil {
			file.Close()
			return nil, err
		}
	}
	return file, nil
}

// setNew gives a file or directory the FS made its mode and owner.
func (f *FS) setNew(file *os.File, p string, mode fs.FileMode) error {
	if f.uid >= 0 || f.gid >= 0 {
		if err := unix.Fchown(int(file.Fd()), f.uid, f.gid); err != nil {
			return pathErr(p, "chown", err)
		}
	}
	// After chown, which clears set-id bits; fchmod ignores the umask.
	if err := unix.Fchmod(int(file.Fd()), unixMode(mode)); err != nil {
		return pathErr(p, "chmod", err)
	}
	return nil
}

// unixMode converts permission and sticky bits to st_mode bits.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSticky != 0 {
		u |= unix.S_ISVTX
	}
	return u
}

// copyChunks copies r to file, checking ctx between chunks.
func copyChunks(ctx context.Context, file *os.File, r io.Reader, p string) (int64, error) {
	return copyBuf(ctx, file, r, p, make([]byte, chunk))
}

// copyBuf is copyChunks through buf.
func copyBuf(ctx context.Context, file *os.File, r io.Reader, p string, buf []byte) (int64, error) {
	var n int64
	for {
		if err := live(ctx); err != nil {
			return n, err
		}
		k, rerr := io.ReadFull(r, buf)
		if k > 0 {
			w, err := file.Write(buf[:k])
			n += int64(w)
			if err != nil {
				return n, pathErr(p, "write", err)
			}
		}
		switch {
		case rerr == io.EOF || rerr == io.ErrUnexpectedEOF:
			return n, nil
		case rerr != nil:
			return n, fmt.Errorf("path %q: read input: %w", p, rerr)
		}
	}
}

// MakeDir creates the directory path with mode (default 0755, umask
// ignored; permission and sticky bits only). With parents, missing parents
// are created too (with the same mode) and an existing directory is not an
// error.
func (f *FS) MakeDir(ctx context.Context, p string, mode fs.FileMode, parents bool) error {
	p, err := cleanPath(p)
	if err != nil {
		return err
	}
	mode, err = checkMode(mode, defaultDirMode, fs.ModePerm|fs.ModeSticky, "permission bits 0777 and fs.ModeSticky")
	if err != nil {
		return err
	}
	if err := live(ctx); err != nil {
		return err
	}
	root, err := f.root()
	if err != nil {
		return err
	}
	defer root.Close()
	if parents {
		return f.mkdirAll(ctx, root, p, mode)
	}
	if p == "/" {
		return errdefs.AlreadyExists("path %q: already exists", p)
	}
	dir, name := path.Split(p)
	parent, err := at(root, path.Clean(dir), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return pathErr(p, "open parent", err)
	}
	defer parent.Close()
	return f.mkdirIn(parent, name, p, mode)
}

// mkdirIn makes the directory name in parent (p is its sandbox path).
func (f *FS) mkdirIn(parent *os.File, name, p string, mode fs.FileMode) error {
	if err := checkData(parent, p); err != nil {
		return err
	}
	if err := unix.Mkdirat(int(parent.Fd()), name, 0o700); err != nil {
		return pathErr(p, "mkdir", err)
	}
	dir, err := openChild(parent, name, unix.O_RDONLY|unix.O_DIRECTORY, true)
	if err != nil {
		return pathErr(p, "open new directory", err)
	}
	defer dir.Close()
	return f.setNew(dir, p, mode)
}

// mkdirAll makes p and its missing parents, one element at a time: each
// element is resolved from the root (so a symlink planted anywhere still
// resolves inside it) and a missing one is made by name in its parent's fd.
func (f *FS) mkdirAll(ctx context.Context, root *os.File, p string, mode fs.FileMode) error {
	parent, err := at(root, "/", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return pathErr("/", "open", err)
	}
	cur := "/"
	for _, name := range strings.Split(p, "/") {
		if name == "" {
			continue
		}
		if err := live(ctx); err != nil {
			parent.Close()
			return err
		}
		cur = path.Join(cur, name)
		next, err := f.stepDir(root, parent, name, cur, mode)
		parent.Close()
		if err != nil {
			return err
		}
		parent = next
	}
	return parent.Close()
}

// stepDir opens the directory cur (element name of parent), making it first
// when it is missing.
func (f *FS) stepDir(root, parent *os.File, name, cur string, mode fs.FileMode) (*os.File, error) {
	const flags = unix.O_PATH | unix.O_DIRECTORY
	dir, err := at(root, cur, flags, 0)
	if err == nil {
		return dir, nil
	}
	if err != unix.ENOENT {
		return nil, pathErr(cur, "open", err)
	}
	err = f.mkdirIn(parent, name, cur, mode)
	if err != nil && !errors.Is(err, errdefs.ErrAlreadyExists) {
		return nil, err
	}
	// Resolve again from the root: whatever is there now (a directory we
	// or a racing writer made, or a planted symlink) resolves inside it.
	dir, err = at(root, cur, flags, 0)
	if err != nil {
		return nil, pathErr(cur, "open", err)
	}
	return dir, nil
}
