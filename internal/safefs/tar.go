package safefs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
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

// Archive writes a tar stream of p to w: p's last element first ("." for
// the root), then, for a directory, its whole tree below it. Symlinks are
// recorded, never followed (a final symlink included); files linked more
// than once become hard link entries; sockets are left out; a directory on
// a kernel pseudo filesystem is recorded without its entries.
func (f *FS) Archive(ctx context.Context, p string, w io.Writer, opts TarOptions) error {
	p, err := cleanPath(p)
	if err != nil {
		return err
	}
	root, err := f.root()
	if err != nil {
		return err
	}
	defer root.Close()
	if p == "/" {
		dir, err := at(root, "/", unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return pathErr(p, "open", err)
		}
		defer dir.Close()
		return ArchiveAt(ctx, dir, ".", ".", w, opts)
	}
	dir, name := path.Split(p)
	parent, err := at(root, path.Clean(dir), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return pathErr(p, "open parent", err)
	}
	defer parent.Close()
	return ArchiveAt(ctx, parent, name, name, w, opts)
}

// ArchiveAt is Archive of the entry name of dir (a single name, or "."),
// recorded as as. Every file is reached by one name from its parent's fd
// without following symlinks, and read through the fd it was checked on.
func ArchiveAt(ctx context.Context, dir *os.File, name, as string, w io.Writer, opts TarOptions) error {
	a := &archiver{tw: tar.NewWriter(w), opts: opts, links: map[[2]uint64]string{}, buf: make([]byte, chunk)}
	if err := a.entry(ctx, dir, name, as); err != nil {
		return err
	}
	return a.tw.Close()
}

type archiver struct {
	tw    *tar.Writer
	opts  TarOptions
	links map[[2]uint64]string // (dev, ino) of files linked more than once -> first name
	buf   []byte
}

func (a *archiver) header(st *unix.Stat_t, name string, typ byte) (*tar.Header, error) {
	uid, gid, err := a.opts.owner(int(st.Uid), int(st.Gid))
	if err != nil {
		return nil, err
	}
	return &tar.Header{
		Typeflag: typ, Name: name, Mode: int64(st.Mode & 0o7777), Uid: uid, Gid: gid,
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec), Format: tar.FormatPAX,
	}, nil
}

// xattrs records file's copied extended attributes in hdr.
func (a *archiver) xattrs(file *os.File, hdr *tar.Header, p string) error {
	fd := int(file.Fd())
	sz, err := unix.Flistxattr(fd, nil)
	if err != nil || sz == 0 {
		return nil // no xattrs, or a filesystem without them
	}
	list := make([]byte, sz)
	if sz, err = unix.Flistxattr(fd, list); err != nil {
		return pathErr(p, "listxattr", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(list[:sz]), "\x00"), "\x00") {
		if name == "" || !a.opts.xattr(name) {
			continue
		}
		vsz, err := unix.Fgetxattr(fd, name, nil)
		if err != nil {
			continue // removed meanwhile
		}
		val := make([]byte, vsz)
		if vsz, err = unix.Fgetxattr(fd, name, val); err != nil {
			continue
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords[paxXattr+name] = string(val[:vsz])
	}
	return nil
}

func (a *archiver) entry(ctx context.Context, dir *os.File, name, as string) error {
	if err := live(ctx); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathErr(as, "lstat", err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return a.dir(ctx, dir, name, as)
	case unix.S_IFREG:
		return a.file(dir, name, as)
	case unix.S_IFLNK:
		target, err := readlinkat(dir, name)
		if err != nil {
			return pathErr(as, "readlink", err)
		}
		hdr, err := a.header(&st, as, tar.TypeSymlink)
		if err != nil {
			return err
		}
		hdr.Linkname = target
		return a.tw.WriteHeader(hdr)
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
		typ := map[uint32]byte{unix.S_IFCHR: tar.TypeChar, unix.S_IFBLK: tar.TypeBlock, unix.S_IFIFO: tar.TypeFifo}[st.Mode&unix.S_IFMT]
		hdr, err := a.header(&st, as, typ)
		if err != nil {
			return err
		}
		hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		return a.tw.WriteHeader(hdr)
	}
	return nil // a socket: nothing to copy
}

func (a *archiver) dir(ctx context.Context, parent *os.File, name, as string) error {
	d, err := openName(parent, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return pathErr(as, "open", err)
	}
	defer d.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(d.Fd()), &st); err != nil {
		return pathErr(as, "fstat", err)
	}
	hdr, err := a.header(&st, as+"/", tar.TypeDir)
	if err != nil {
		return err
	}
	if err := a.xattrs(d, hdr, as); err != nil {
		return err
	}
	if err := a.tw.WriteHeader(hdr); err != nil {
		return err
	}
	if checkData(d, as) != nil {
		return nil // /proc and the like: the host kernel's, not data
	}
	names, err := readNames(ctx, d, as)
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, n := range names {
		if err := a.entry(ctx, d, n, path.Join(as, n)); err != nil {
			return err
		}
	}
	return nil
}

func (a *archiver) file(parent *os.File, name, as string) error {
	file, err := openName(parent, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return pathErr(as, "open", err)
	}
	defer file.Close()
	if err := checkRegular(file, as); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(file.Fd()), &st); err != nil {
		return pathErr(as, "fstat", err)
	}
	key := [2]uint64{st.Dev, st.Ino}
	if first, ok := a.links[key]; ok {
		hdr, err := a.header(&st, as, tar.TypeLink)
		if err != nil {
			return err
		}
		hdr.Linkname = first
		return a.tw.WriteHeader(hdr)
	}
	if st.Nlink > 1 {
		a.links[key] = as
	}
	hdr, err := a.header(&st, as, tar.TypeReg)
	if err != nil {
		return err
	}
	hdr.Size = st.Size
	if err := a.xattrs(file, hdr, as); err != nil {
		return err
	}
	if err := a.tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.CopyBuffer(a.tw, io.LimitReader(file, st.Size), a.buf)
	if err != nil {
		return fmt.Errorf("path %q: read: %w", as, err)
	}
	if n != st.Size {
		return errdefs.FailedPrecondition("path %q: shrank from %d to %d bytes while being read", as, st.Size, n)
	}
	return nil
}

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

// Extract unpacks the tar stream r into the directory dest (made, with its
// parents, when missing) and returns the entries and content bytes
// written. Each entry's parent is resolved inside the root (so no symlink,
// planted or archived, leads out of it) and the entry is made by name in
// that parent's fd: directories, regular files, symlinks and hard links
// (to files inside the root), with their modes (set-id and sticky bits
// too), owners through opts.Owner, mtimes and the xattrs opts.Xattr
// admits. An existing file or symlink at an entry's name is replaced, an
// existing directory is kept (its metadata updated). Devices and FIFOs are
// refused. On error what was extracted so far stays.
func (f *FS) Extract(ctx context.Context, dest string, r io.Reader, opts TarOptions) (entries, bytes int64, err error) {
	dest, err = cleanPath(dest)
	if err != nil {
		return 0, 0, err
	}
	root, err := f.root()
	if err != nil {
		return 0, 0, err
	}
	defer root.Close()
	if err := f.mkdirAll(ctx, root, dest, defaultDirMode); err != nil {
		return 0, 0, err
	}
	x := &extractor{f: f, root: root, dest: dest, opts: opts, buf: make([]byte, chunk)}
	x.startWriters()
	stop := func() error {
		x.closeParent()
		return x.stopWriters()
	}
	tr := tar.NewReader(r)
	for {
		if err := live(ctx); err != nil {
			return entries, x.bytes, errors.Join(err, stop())
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return entries, x.bytes, errors.Join(errdefs.InvalidArgument("tar stream: %v", err), stop())
		}
		if err := x.entry(ctx, hdr, tr); err != nil {
			return entries, x.bytes, errors.Join(err, stop())
		}
		entries++
	}
	if err := stop(); err != nil {
		return entries, x.bytes, err
	}
	// Directory mtimes last (making their entries changed them), deepest first.
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		dir, err := at(root, d.path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return entries, x.bytes, pathErr(d.path, "open", err)
		}
		err = setTimes(dir, d.mtime, d.path)
		dir.Close()
		if err != nil {
			return entries, x.bytes, err
		}
	}
	return entries, x.bytes, nil
}

type extractor struct {
	f          *FS
	root       *os.File
	dest       string
	opts       TarOptions
	buf        []byte
	bytes      int64
	dirs       []dirTime
	parent     *sharedFile // the last entry's parent, reused by its siblings
	parentPath string

	// Small files are written by writers, in parallel: file creation is
	// syscall-bound, and a tree is mostly small files.
	jobs    chan fileJob
	pending sync.WaitGroup  // jobs not yet written
	queued  map[string]bool // paths handed to writers since the last drain
	writers sync.WaitGroup
	errMu   sync.Mutex
	err     error // the first writer error
}

// Writers and the size up to which a file goes to them (read whole into
// memory first; at most writerQueue of them wait).
const (
	writerCount = 4
	writerQueue = 64
	smallFile   = 256 << 10
)

// sharedFile is a directory fd used by the extractor and its writers;
// the last release closes it.
type sharedFile struct {
	*os.File
	refs atomic.Int32
}

func (f *sharedFile) release() {
	if f.refs.Add(-1) == 0 {
		f.Close()
	}
}

type fileJob struct {
	parent   *sharedFile
	name, p  string
	hdr      *tar.Header
	uid, gid int
	data     []byte
}

// drain waits for every queued file (before an entry that depends on one:
// a hard link to it, or a later entry of the same name, which must win).
func (x *extractor) drain() error {
	x.pending.Wait()
	clear(x.queued)
	return x.failed()
}

func (x *extractor) startWriters() {
	x.jobs = make(chan fileJob, writerQueue)
	x.queued = map[string]bool{}
	run := x.opts.Run
	if run == nil {
		run = func(fn func() error) error { return fn() }
	}
	for range writerCount {
		x.writers.Add(1)
		go func() {
			defer x.writers.Done()
			err := run(func() error {
				for j := range x.jobs {
					x.fail(x.writeSmall(j))
					j.parent.release()
					x.pending.Done()
				}
				return nil
			})
			x.fail(err)
			for j := range x.jobs { // run failed: drain, so nothing blocks
				j.parent.release()
				x.pending.Done()
			}
		}()
	}
}

// stopWriters waits for every queued file and returns the first error.
func (x *extractor) stopWriters() error {
	close(x.jobs)
	x.writers.Wait()
	return x.failed()
}

func (x *extractor) fail(err error) {
	if err == nil {
		return
	}
	x.errMu.Lock()
	if x.err == nil {
		x.err = err
	}
	x.errMu.Unlock()
}

func (x *extractor) failed() error {
	x.errMu.Lock()
	defer x.errMu.Unlock()
	return x.err
}

// createFile makes name in parent anew, replacing a file or symlink there.
func createFile(parent *os.File, name, p string) (*os.File, error) {
	const create = unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL
	file, err := openName(parent, name, create, 0o600)
	if err == unix.EEXIST {
		if err := unlinkNonDir(int(parent.Fd()), name, p); err != nil {
			return nil, err
		}
		file, err = openName(parent, name, create, 0o600)
	}
	if err != nil {
		return nil, pathErr(p, "create", err)
	}
	return file, nil
}

func (x *extractor) writeSmall(j fileJob) error {
	file, err := createFile(j.parent.File, j.name, j.p)
	if err != nil {
		return err
	}
	defer file.Close()
	if _, err := file.Write(j.data); err != nil {
		return pathErr(j.p, "write", err)
	}
	return x.meta(file, j.hdr, j.uid, j.gid, j.p)
}

type dirTime struct {
	path  string
	mtime time.Time
}

func (x *extractor) closeParent() {
	if x.parent != nil {
		x.parent.release()
		x.parent = nil
	}
}

// target is where an archive name lands: dest joined with the name made
// absolute and clean, so ".." never climbs above dest.
func (x *extractor) target(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 || len(name) > maxPath {
		return "", errdefs.InvalidArgument("tar entry %q: bad name", name)
	}
	return path.Join(x.dest, path.Clean("/"+name)), nil
}

// parentOf opens the directory holding p inside the root (a data
// directory, not a kernel filesystem's), making it when missing.
func (x *extractor) parentOf(ctx context.Context, p string) (*sharedFile, error) {
	dir := path.Dir(p)
	if x.parent != nil && x.parentPath == dir {
		return x.parent, nil
	}
	x.closeParent()
	parent, err := at(x.root, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == unix.ENOENT {
		if err := x.f.mkdirAll(ctx, x.root, dir, defaultDirMode); err != nil {
			return nil, err
		}
		parent, err = at(x.root, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	}
	if err != nil {
		return nil, pathErr(p, "open parent", err)
	}
	if err := checkData(parent, p); err != nil {
		parent.Close()
		return nil, err
	}
	x.parent, x.parentPath = &sharedFile{File: parent}, dir
	x.parent.refs.Store(1)
	return x.parent, nil
}

func (x *extractor) entry(ctx context.Context, hdr *tar.Header, body io.Reader) error {
	p, err := x.target(hdr.Name)
	if err != nil {
		return err
	}
	uid, gid, err := x.opts.owner(hdr.Uid, hdr.Gid)
	if err != nil {
		return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
	}
	if x.queued[p] {
		if err := x.drain(); err != nil {
			return err
		}
	}
	if p == "/" || p == x.dest {
		if hdr.Typeflag != tar.TypeDir {
			return errdefs.InvalidArgument("tar entry %q: lands on %s, which is a directory", hdr.Name, x.dest)
		}
		dir, err := at(x.root, p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return pathErr(p, "open", err)
		}
		defer dir.Close()
		x.dirs = append(x.dirs, dirTime{p, hdr.ModTime})
		return x.meta(dir, hdr, uid, gid, p)
	}
	shared, err := x.parentOf(ctx, p)
	if err != nil {
		return err
	}
	parent := shared.File
	name := path.Base(p)
	pfd := int(parent.Fd())
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, name, 0o700); err != nil && err != unix.EEXIST {
			return pathErr(p, "mkdir", err)
		}
		dir, err := openName(parent, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return pathErr(p, "open directory", err)
		}
		defer dir.Close()
		x.dirs = append(x.dirs, dirTime{p, hdr.ModTime})
		return x.meta(dir, hdr, uid, gid, p)
	case tar.TypeReg:
		if hdr.Size <= smallFile {
			data := make([]byte, hdr.Size)
			if _, err := io.ReadFull(body, data); err != nil {
				return errdefs.InvalidArgument("tar entry %q: %v", hdr.Name, err)
			}
			shared.refs.Add(1)
			x.pending.Add(1)
			x.queued[p] = true
			x.jobs <- fileJob{parent: shared, name: name, p: p, hdr: hdr, uid: uid, gid: gid, data: data}
			x.bytes += hdr.Size
			return x.failed()
		}
		file, err := createFile(parent, name, p)
		if err != nil {
			return err
		}
		defer file.Close()
		n, err := copyBuf(ctx, file, body, p, x.buf)
		x.bytes += n
		if err != nil {
			return err
		}
		if n != hdr.Size {
			return errdefs.InvalidArgument("tar entry %q: %d of %d bytes", hdr.Name, n, hdr.Size)
		}
		return x.meta(file, hdr, uid, gid, p)
	case tar.TypeSymlink:
		if err := unlinkNonDir(pfd, name, p); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, name); err != nil {
			return pathErr(p, "symlink", err)
		}
		if err := unix.Fchownat(pfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return pathErr(p, "chown", err)
		}
		ts := times(hdr.ModTime)
		if err := unix.UtimesNanoAt(pfd, name, ts[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return pathErr(p, "utimes", err)
		}
		return nil
	case tar.TypeLink:
		if err := x.drain(); err != nil { // its target may still be queued
			return err
		}
		old, err := x.target(hdr.Linkname)
		if err != nil {
			return err
		}
		oldDir, err := at(x.root, path.Dir(old), unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return pathErr(old, "open parent", err)
		}
		defer oldDir.Close()
		if err := unlinkNonDir(pfd, name, p); err != nil {
			return err
		}
		// Flags 0: a symlink at old is linked itself, never followed.
		if err := unix.Linkat(int(oldDir.Fd()), path.Base(old), pfd, name, 0); err != nil {
			if err == unix.ENOENT {
				return errdefs.NotFound("tar entry %q: hard link target %q is not in the sandbox", hdr.Name, old)
			}
			return pathErr(p, "link to "+old, err)
		}
		return nil
	}
	return errdefs.InvalidArgument("tar entry %q: type %q is not supported (only directories, files, symlinks and hard links)", hdr.Name, string(hdr.Typeflag))
}

// unlinkNonDir removes what is at name so that an entry can replace it; a
// directory is refused.
func unlinkNonDir(pfd int, name, p string) error {
	err := unix.Unlinkat(pfd, name, 0)
	switch err {
	case nil, unix.ENOENT:
		return nil
	case unix.EISDIR:
		return errdefs.FailedPrecondition("path %q: a directory is in the way of a tar entry that is not one", p)
	}
	return pathErr(p, "unlink", err)
}

// meta gives an extracted file or directory its owner, mode, xattrs and
// mtime, in that order (chown clears set-id bits).
func (x *extractor) meta(file *os.File, hdr *tar.Header, uid, gid int, p string) error {
	fd := int(file.Fd())
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return pathErr(p, "chown", err)
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return pathErr(p, "chmod", err)
	}
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, paxXattr)
		if !ok || !x.opts.xattr(name) {
			continue
		}
		if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil {
			return pathErr(p, "setxattr "+name, err)
		}
	}
	if hdr.Typeflag == tar.TypeDir {
		return nil // after its entries: see Extract
	}
	return setTimes(file, hdr.ModTime, p)
}

func times(mtime time.Time) [2]unix.Timespec {
	ts := unix.NsecToTimespec(mtime.UnixNano())
	return [2]unix.Timespec{ts, ts}
}

func setTimes(file *os.File, mtime time.Time, p string) error {
	ts := times(mtime)
	if err := unix.UtimesNanoAt(int(file.Fd()), "", ts[:], unix.AT_EMPTY_PATH); err != nil {
		return pathErr(p, "utimes", err)
	}
	return nil
}
