package client

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const paxXattr = "SCHILY.xattr."

// writeTar writes a tar stream of the tree at dir to w, entries named
// relative to it ("./" first): directories, files, symlinks (not
// followed), hard links, modes, numeric owners, mtimes and xattrs.
func writeTar(ctx context.Context, dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	links := map[[2]uint64]string{}
	buf := make([]byte, 1<<20)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return tarEntry(tw, p, name, fi, links, buf)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func tarEntry(tw *tar.Writer, p, name string, fi fs.FileInfo, links map[[2]uint64]string, buf []byte) error {
	st, _ := fi.Sys().(*syscall.Stat_t)
	var link string
	if fi.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	hdr.Name, hdr.Format, hdr.Uname, hdr.Gname = name, tar.FormatPAX, "", ""
	if fi.IsDir() {
		hdr.Name = strings.TrimSuffix(name, "/") + "/"
	}
	if st != nil {
		hdr.ModTime = time.Unix(st.Mtim.Sec, st.Mtim.Nsec)
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			key := [2]uint64{st.Dev, st.Ino}
			if first, ok := links[key]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				return tw.WriteHeader(hdr)
			}
			links[key] = name
		}
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		addXattrs(hdr, p)
	}
	if !fi.Mode().IsRegular() {
		return tw.WriteHeader(hdr)
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.CopyBuffer(tw, io.LimitReader(f, hdr.Size), buf)
	if err == nil && n != hdr.Size {
		err = fmt.Errorf("%s: shrank while being read", p)
	}
	return err
}

// addXattrs records p's readable extended attributes.
func addXattrs(hdr *tar.Header, p string) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return
	}
	list := make([]byte, sz)
	if sz, err = unix.Llistxattr(p, list); err != nil {
		return
	}
	for _, name := range strings.Split(strings.TrimRight(string(list[:sz]), "\x00"), "\x00") {
		vsz, err := unix.Lgetxattr(p, name, nil)
		if name == "" || err != nil {
			continue
		}
		val := make([]byte, vsz)
		if vsz, err = unix.Lgetxattr(p, name, val); err != nil {
			continue
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords[paxXattr+name] = string(val[:vsz])
	}
}

// extractTar unpacks a tar stream into dir (created when missing) with
// os.Root, so no entry name, symlink or hard link resolves outside dir
// whatever the stream (a sandbox's files) holds. strip leading path
// components are dropped from every name (1: the archive's top entry is
// dir itself). Owners are kept when running as root; user.* xattrs, modes
// and mtimes always; devices and FIFOs are skipped.
func extractTar(ctx context.Context, r io.Reader, dir string, strip int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	type dirTime struct {
		name  string
		mtime time.Time
	}
	var dirs []dirTime
	asRoot := os.Geteuid() == 0
	// in is the os.Root of the last entry's parent directory, so that its
	// siblings' calls resolve one name instead of the whole path.
	in, inDir := root, "."
	defer func() {
		if in != root {
			in.Close()
		}
	}()
	parentOf := func(name string) (*os.Root, string, error) {
		dir, base := path.Split(name)
		if dir = path.Clean(dir); dir != inDir {
			if in != root {
				in.Close()
			}
			in, inDir = root, "."
			if dir != "." {
				sub, err := root.OpenRoot(dir)
				if err != nil {
					return nil, "", err
				}
				in, inDir = sub, dir
			}
		}
		if base == "" {
			base = "."
		}
		return in, base, nil
	}
	tr := tar.NewReader(r)
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("tar stream: %w", err)
		}
		name, ok := stripName(hdr.Name, strip)
		if !ok {
			continue
		}
		if hdr.Typeflag == tar.TypeLink {
			old, ok := stripName(hdr.Linkname, strip)
			if !ok {
				return fmt.Errorf("tar entry %q: hard link to %q outside the copy", hdr.Name, hdr.Linkname)
			}
			_ = root.Remove(name)
			if err := root.Link(old, name); err != nil {
				return err
			}
			continue
		}
		if hdr.Typeflag == tar.TypeDir && name != "." {
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		}
		parent, base, err := parentOf(name)
		if err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			dirs = append(dirs, dirTime{name, hdr.ModTime})
		case tar.TypeReg:
			f, err := parent.OpenFile(base, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if errors.Is(err, fs.ErrExist) {
				_ = parent.Remove(base)
				f, err = parent.OpenFile(base, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			}
			if err != nil {
				return err
			}
			// Without the file's ReadFrom, which would ignore buf and
			// copy through a fresh 32 KiB buffer for every file.
			_, err = io.CopyBuffer(struct{ io.Writer }{f}, tr, buf)
			if err == nil {
				err = fileMeta(f, hdr, asRoot)
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			continue
		case tar.TypeSymlink:
			_ = parent.Remove(base)
			if err := parent.Symlink(hdr.Linkname, base); err != nil {
				return err
			}
			if asRoot {
				if err := parent.Lchown(base, hdr.Uid, hdr.Gid); err != nil {
					return err
				}
			}
			continue // no chmod or chtimes: they would follow the link
		default:
			continue
		}
		if asRoot {
			if err := parent.Lchown(base, hdr.Uid, hdr.Gid); err != nil {
				return err
			}
		}
		if err := parent.Chmod(base, tarMode(hdr)); err != nil {
			return err
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if d := dirs[i]; root.Chtimes(d.name, d.mtime, d.mtime) != nil {
			return fmt.Errorf("set the mtime of %s", d.name)
		}
	}
	return nil
}

// stripName cleans an archive name and drops its first strip components;
// ok is false when nothing is left of it (or it climbs out with "..").
func stripName(name string, strip int) (string, bool) {
	clean := path.Clean("/" + name)[1:]
	for range strip {
		if clean == "" {
			return "", false
		}
		_, rest, found := strings.Cut(clean, "/")
		if !found {
			rest = ""
		}
		clean = rest
	}
	if clean == "" {
		return ".", true
	}
	return clean, true
}

// tarMode is hdr's permission, set-id and sticky bits as an fs.FileMode.
func tarMode(hdr *tar.Header) fs.FileMode {
	mode := fs.FileMode(hdr.Mode & 0o777)
	for bit, m := range map[int64]fs.FileMode{0o4000: fs.ModeSetuid, 0o2000: fs.ModeSetgid, 0o1000: fs.ModeSticky} {
		if hdr.Mode&bit != 0 {
			mode |= m
		}
	}
	return mode
}

// fileMeta gives an extracted file its owner (as root), mode, xattrs and
// mtime through its fd (no path lookups).
func fileMeta(f *os.File, hdr *tar.Header, asRoot bool) error {
	if asRoot {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if err := f.Chmod(tarMode(hdr)); err != nil {
		return err
	}
	setXattrs(f, hdr)
	ts := unix.NsecToTimespec(hdr.ModTime.UnixNano())
	return unix.UtimesNanoAt(int(f.Fd()), "", []unix.Timespec{ts, ts}, unix.AT_EMPTY_PATH)
}

func setXattrs(f *os.File, hdr *tar.Header) {
	for k, v := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, paxXattr); ok && strings.HasPrefix(name, "user.") {
			_ = unix.Fsetxattr(int(f.Fd()), name, []byte(v), 0)
		}
	}
}
