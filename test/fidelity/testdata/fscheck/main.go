// Command fscheck reports, inside a sandbox, what the standard library's
// tests do not look at: directory entries whose readdir d_ino differs from
// stat's st_ino, files with an mtime before 1980 (which zip cannot store),
// and the file size limit. It walks the roots given as arguments without
// leaving their filesystem, and prints one line per finding, then totals.
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

var zipEpoch = time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC).Unix()

func main() {
	entries, mismatches, old := 0, 0, 0
	for _, root := range os.Args[1:] {
		var rootSt syscall.Stat_t
		if err := syscall.Lstat(root, &rootSt); err != nil {
			fmt.Println("error", root, err)
			os.Exit(1)
		}
		walk(root, rootSt.Dev, func(path string, dIno uint64, st *syscall.Stat_t) {
			entries++
			if dIno != st.Ino {
				mismatches++
				fmt.Printf("inode %s d_ino=%d st_ino=%d dir=%v\n", path, dIno, st.Ino, st.Mode&syscall.S_IFMT == syscall.S_IFDIR)
			}
			if st.Mtim.Sec < zipEpoch {
				old++
				if old <= 20 {
					fmt.Printf("mtime %s %s\n", path, time.Unix(st.Mtim.Sec, 0).UTC())
				}
			}
		})
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		fmt.Println("error rlimit", err)
		os.Exit(1)
	}
	fsize := "unlimited"
	if lim.Cur != ^uint64(0) || lim.Max != ^uint64(0) {
		fsize = fmt.Sprintf("%d/%d", lim.Cur, lim.Max)
	}
	fmt.Printf("total entries=%d inode_mismatches=%d before_1980=%d fsize=%s\n", entries, mismatches, old, fsize)
}

// walk calls fn for every entry under dir (on device dev) with the d_ino
// readdir gave it and its lstat.
func walk(dir string, dev uint64, fn func(string, uint64, *syscall.Stat_t)) {
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		fmt.Println("error", dir, err)
		return
	}
	defer syscall.Close(fd)
	buf := make([]byte, 32<<10)
	for {
		n, err := syscall.ReadDirent(fd, buf)
		if err != nil {
			fmt.Println("error", dir, err)
			return
		}
		if n <= 0 {
			return
		}
		// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
		for b := buf[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:]))
			ino := binary.NativeEndian.Uint64(b[0:])
			name := b[19:reclen]
			for i, c := range name {
				if c == 0 {
					name = name[:i]
					break
				}
			}
			b = b[reclen:]
			if s := string(name); s != "." && s != ".." {
				p := filepath.Join(dir, s)
				var st syscall.Stat_t
				if err := syscall.Lstat(p, &st); err != nil {
					fmt.Println("error", p, err)
					continue
				}
				if st.Dev != dev {
					continue // another mount: /proc, /dev, /sys ...
				}
				fn(p, ino, &st)
				if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
					walk(p, dev, fn)
				}
			}
		}
	}
}
