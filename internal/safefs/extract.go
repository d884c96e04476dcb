package safefs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

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
