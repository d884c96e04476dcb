package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// TreeStats describe a tree MakeTree wrote.
type TreeStats struct {
	Files, Dirs, Symlinks, HardLinks int
	Bytes                            int64
}

// MakeTree writes a random tree of about size bytes under dir (made when
// missing): half in 4 big files, half in small files (0..16 KiB, 64 to a
// directory), with symlinks (relative, absolute, dangling), hard links,
// varied modes, owners and mtimes, and user.* xattrs. Data comes from a
// seeded ChaCha8 stream, so it is fast and the same for a seed.
func MakeTree(dir string, size int64, seed uint64) (TreeStats, error) {
	return MakeShapedTree(dir, size, seed, TreeMixed)
}

// TreeShape says how a tree's bytes are split between big and small files.
type TreeShape string

const (
	TreeMixed TreeShape = "mixed" // MakeTree's: half big, half small
	TreeSmall TreeShape = "small" // all in small files, with the links, owners and xattrs
	TreeLarge TreeShape = "large" // all in 4 big files
)

// MakeShapedTree is MakeTree with the bytes split as shape says.
func MakeShapedTree(dir string, size int64, seed uint64, shape TreeShape) (TreeStats, error) {
	var st TreeStats
	bigBytes, ok := map[TreeShape]int64{TreeMixed: size / 2, TreeSmall: 0, TreeLarge: size}[shape]
	if !ok {
		return st, fmt.Errorf("tree shape %q: want mixed, small or large", shape)
	}
	rng := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return st, err
	}
	buf := make([]byte, 1<<20)
	fill := func(b []byte) {
		for i := 0; i+8 <= len(b); i += 8 {
			v := rng.Uint64()
			b[i], b[i+1], b[i+2], b[i+3], b[i+4], b[i+5], b[i+6], b[i+7] =
				byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
		}
	}
	mtime := func() time.Time {
		return time.Unix(1_500_000_000+rng.Int64N(200_000_000), rng.Int64N(1e9))
	}
	write := func(p string, n int64, mode fs.FileMode) error {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		for left := n; left > 0; {
			k := min(left, int64(len(buf)))
			fill(buf[:k])
			if _, err := f.Write(buf[:k]); err != nil {
				f.Close()
				return err
			}
			left -= k
		}
		if err := f.Close(); err != nil {
			return err
		}
		st.Files++
		st.Bytes += n
		return os.Chmod(p, mode)
	}
	big := filepath.Join(dir, "big")
	if err := os.Mkdir(big, 0o755); err != nil {
		return st, err
	}
	st.Dirs++
	for i := range 4 {
		if bigBytes == 0 {
			break
		}
		if err := write(filepath.Join(big, "blob"+strconv.Itoa(i)), bigBytes/4, 0o644); err != nil {
			return st, err
		}
	}
	modes := []fs.FileMode{0o644, 0o600, 0o755, 0o444, 0o640, 0o700}
	var files []string
	for i, small := 0, int64(0); small < size-bigBytes; i++ {
		sub := filepath.Join(dir, "src", "d"+strconv.Itoa(i/64))
		if i%64 == 0 {
			if err := os.MkdirAll(sub, 0o755); err != nil {
				return st, err
			}
			st.Dirs++
		}
		p := filepath.Join(sub, "f"+strconv.Itoa(i))
		n := rng.Int64N(16 << 10)
		if err := write(p, n, modes[i%len(modes)]); err != nil {
			return st, err
		}
		small += n
		files = append(files, p)
	}
	// Metadata on some of them.
	for i, p := range files {
		switch i % 16 {
		case 1:
			if err := os.Lchown(p, 1000, 1000); err != nil {
				return st, err
			}
		case 2:
			if err := unix.Setxattr(p, "user.corral.test", []byte("v"+strconv.Itoa(i)), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
				return st, err
			}
		case 3:
			if err := os.Link(p, p+".hard"); err != nil {
				return st, err
			}
			st.HardLinks++
		case 4:
			if err := os.Symlink(filepath.Base(files[i-1]), p+".rel"); err != nil {
				return st, err
			}
			st.Symlinks++
		case 5:
			if err := os.Symlink("/etc/hostname", p+".abs"); err != nil {
				return st, err
			}
			st.Symlinks++
		case 6:
			if err := os.Symlink("nowhere/at/all", p+".dangling"); err != nil {
				return st, err
			}
			st.Symlinks++
		}
		if err := os.Chtimes(p, time.Time{}, mtime()); err != nil {
			return st, err
		}
	}
	// Directory mtimes last (their entries changed them).
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		return os.Chtimes(p, time.Time{}, mtime())
	})
	return st, err
}

// entryInfo is what CompareTrees compares of one entry.
type entryInfo struct {
	mode     fs.FileMode
	uid, gid uint32
	size     int64
	mtime    int64 // ns; not compared for symlinks
	link     string
	xattr    string
	group    int // hard link group: the index of the first name of its inode
}

func scanTree(root string) (map[string]entryInfo, []string, error) {
	out := map[string]entryInfo{}
	var names []string
	inodes := map[[2]uint64]int{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		e := entryInfo{mode: fi.Mode(), uid: st.Uid, gid: st.Gid, mtime: st.Mtim.Nano(), group: -1}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			e.link, _ = os.Readlink(p)
			e.mtime = 0
		case fi.Mode().IsRegular():
			e.size = fi.Size()
			val := make([]byte, 256)
			if n, err := unix.Lgetxattr(p, "user.corral.test", val); err == nil {
				e.xattr = string(val[:n])
			}
			key := [2]uint64{st.Dev, st.Ino}
			if g, ok := inodes[key]; ok {
				e.group = g
			} else if st.Nlink > 1 {
				inodes[key] = len(names)
				e.group = len(names)
			}
		}
		out[rel] = e
		names = append(names, rel)
		return nil
	})
	return out, names, err
}

// CompareTrees reports the first difference between the trees at a and b:
// the set of names, types, modes, owners, sizes, mtimes (not of
// symlinks), symlink targets, user.corral.test xattrs, hard link groups
// and every byte of file content.
func CompareTrees(a, b string) error {
	ea, na, err := scanTree(a)
	if err != nil {
		return err
	}
	eb, nb, err := scanTree(b)
	if err != nil {
		return err
	}
	slices.Sort(na)
	slices.Sort(nb)
	if !slices.Equal(na, nb) {
		for _, n := range na {
			if _, ok := eb[n]; !ok {
				return fmt.Errorf("%s: missing from the copy (%d entries, original %d)", n, len(nb), len(na))
			}
		}
		return fmt.Errorf("the copy has %d entries, the original %d", len(nb), len(na))
	}
	// Hard link groups are compared by their first name (in sorted order).
	firsts := func(es map[string]entryInfo, names []string) map[int]string {
		m := map[int]string{}
		for _, n := range names {
			if g := es[n].group; g >= 0 {
				if _, ok := m[g]; !ok {
					m[g] = n
				}
			}
		}
		return m
	}
	fa, fb := firsts(ea, na), firsts(eb, nb)
	for _, n := range na {
		x, y := ea[n], eb[n]
		gx, gy := fa[x.group], fb[y.group]
		x.group, y.group = 0, 0
		if x != y || gx != gy {
			return fmt.Errorf("%s: original %+v (links with %q), copy %+v (links with %q)", n, x, gx, y, gy)
		}
		if x.mode.IsRegular() {
			if err := sameContent(filepath.Join(a, n), filepath.Join(b, n)); err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
		}
	}
	return nil
}

func sameContent(a, b string) error {
	fa, err := os.Open(a)
	if err != nil {
		return err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return err
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for {
		n, erra := io.ReadFull(fa, ba)
		m, errb := io.ReadFull(fb, bb)
		if !bytes.Equal(ba[:n], bb[:m]) {
			return fmt.Errorf("content differs")
		}
		if erra != nil || errb != nil {
			if (erra == io.EOF || erra == io.ErrUnexpectedEOF) && (errb == io.EOF || errb == io.ErrUnexpectedEOF) {
				return nil
			}
			return errors.Join(erra, errb)
		}
	}
}
