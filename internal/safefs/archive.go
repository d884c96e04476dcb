package safefs

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

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
