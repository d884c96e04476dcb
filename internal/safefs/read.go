package safefs

import (
	"context"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// maxEntries caps one ListDir answer; a bigger directory is refused rather
// than held in memory.
const maxEntries = 100_000

// ReadFile opens the regular file at path for reading from offset, at most
// limit bytes (0: to the end). A symlink at path is followed inside the
// root. FIFOs, devices, sockets and files on kernel pseudo filesystems are
// refused: they could block, never end, or expose the host. The reader
// checks ctx before every read; the caller closes it.
func (f *FS) ReadFile(ctx context.Context, p string, offset, limit int64) (io.ReadCloser, error) {
	p, err := cleanPath(p)
	if err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, errdefs.InvalidArgument("offset: must not be negative (got %d)", offset)
	}
	if limit < 0 {
		return nil, errdefs.InvalidArgument("limit: must not be negative (got %d)", limit)
	}
	if err := live(ctx); err != nil {
		return nil, err
	}
	// O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOCTTY: a
	// terminal must not become ours.
	file, err := f.openIn(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	if err := checkRegular(file, p); err != nil {
		file.Close()
		return nil, err
	}
	n := int64(math.MaxInt64) - offset
	if limit > 0 && limit < n {
		n = limit
	}
	return &reader{ctx: ctx, file: file, r: io.NewSectionReader(file, offset, n)}, nil
}

// checkRegular refuses anything but a regular data file and leaves file in
// blocking mode.
func checkRegular(file *os.File, p string) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(file.Fd()), &st); err != nil {
		return pathErr(p, "fstat", err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return errdefs.InvalidArgument("path %q: is a directory", p)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return errdefs.InvalidArgument("path %q: not a regular file (%s)", p, typeName(st.Mode))
	}
	if err := checkData(file, p); err != nil {
		return err
	}
	if err := unix.SetNonblock(int(file.Fd()), false); err != nil {
		return pathErr(p, "fcntl", err)
	}
	return nil
}

// reader streams a file section and stops when its context ends.
type reader struct {
	ctx  context.Context
	file *os.File
	r    io.Reader
}

func (r *reader) Read(p []byte) (int, error) {
	if err := live(r.ctx); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

func (r *reader) Close() error { return r.file.Close() }

// Stat describes path without following a symlink in its last element
// (lstat semantics: a symlink is reported with fs.ModeSymlink); symlinks in
// earlier elements are followed inside the root.
func (f *FS) Stat(ctx context.Context, p string) (backend.FileInfo, error) {
	p, err := cleanPath(p)
	if err != nil {
		return backend.FileInfo{}, err
	}
	if err := live(ctx); err != nil {
		return backend.FileInfo{}, err
	}
	var st unix.Stat_t
	if p == "/" {
		root, err := f.root()
		if err != nil {
			return backend.FileInfo{}, err
		}
		defer root.Close()
		if err := unix.Fstat(int(root.Fd()), &st); err != nil {
			return backend.FileInfo{}, pathErr(p, "fstat", err)
		}
		return fileInfo(p, &st), nil
	}
	parent, name, err := f.openParent(p)
	if err != nil {
		return backend.FileInfo{}, err
	}
	defer parent.Close()
	if err := unix.Fstatat(int(parent.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return backend.FileInfo{}, pathErr(p, "lstat", err)
	}
	return withLink(fileInfo(p, &st), parent, name), nil
}

// withLink fills in a symlink's target, read (never followed) from dir.
func withLink(fi backend.FileInfo, dir *os.File, name string) backend.FileInfo {
	if fi.Mode&fs.ModeSymlink == 0 {
		return fi
	}
	buf := make([]byte, maxPath)
	if n, err := unix.Readlinkat(int(dir.Fd()), name, buf); err == nil {
		fi.LinkTarget = string(buf[:n])
	}
	return fi
}

// ListDir lists the directory at path (a symlink to a directory is followed
// inside the root), sorted by name. Entries are described without following
// symlinks; "." and ".." are left out.
func (f *FS) ListDir(ctx context.Context, p string) ([]backend.FileInfo, error) {
	p, err := cleanPath(p)
	if err != nil {
		return nil, err
	}
	if err := live(ctx); err != nil {
		return nil, err
	}
	dir, err := f.openIn(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	names, err := readNames(ctx, dir, p)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]backend.FileInfo, 0, len(names))
	for _, name := range names {
		var st unix.Stat_t
		err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == unix.ENOENT {
			continue // removed while we listed
		}
		child := path.Join(p, name)
		if err != nil {
			return nil, pathErr(child, "lstat", err)
		}
		out = append(out, withLink(fileInfo(child, &st), dir, name))
	}
	return out, nil
}

// readNames returns the names in dir except "." and "..", checking ctx
// between getdents batches.
func readNames(ctx context.Context, dir *os.File, p string) ([]string, error) {
	buf := make([]byte, 64<<10)
	var names []string
	for {
		if err := live(ctx); err != nil {
			return nil, err
		}
		n, err := unix.Getdents(int(dir.Fd()), buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, pathErr(p, "getdents", err)
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
		if len(names) > maxEntries {
			return nil, errdefs.ResourceExhausted("path %q: more than %d entries; list it with exec", p, maxEntries)
		}
	}
}

// fileInfo converts a stat result for the sandbox path p.
func fileInfo(p string, st *unix.Stat_t) backend.FileInfo {
	return backend.FileInfo{
		Name:    path.Base(p),
		Path:    p,
		Size:    st.Size,
		Mode:    fileMode(st.Mode),
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		UID:     st.Uid,
		GID:     st.Gid,
	}
}

// fileMode converts st_mode to an fs.FileMode.
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// typeName names a non-regular file type for error messages.
func typeName(m uint32) string {
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "named pipe"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	}
	return "unknown type"
}
