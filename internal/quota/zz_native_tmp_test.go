package quota

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// temporary: the Create/Remove syscall sequence minus quotactl, on XFS
// mounted with or without prjquota (QUOTA=1).
func BenchmarkZZSeq(b *testing.B) {
	dir := b.TempDir()
	img := filepath.Join(dir, "img")
	if err := makeImage(context.Background(), img, 1<<30); err != nil {
		b.Fatal(err)
	}
	dev, fd, err := attachLoop(img)
	if err != nil {
		b.Fatal(err)
	}
	mnt := filepath.Join(dir, "m")
	os.Mkdir(mnt, 0o700)
	opts := ""
	if os.Getenv("QUOTA") != "" {
		opts = "prjquota"
	}
	if err := unix.Mount(dev, mnt, "xfs", unix.MS_NOATIME, opts); err != nil {
		b.Fatal(err)
	}
	unix.Close(fd)
	defer unix.Unmount(mnt, 0)
	root, _ := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	defer unix.Close(root)
	unix.Mkdirat(root, ".trash", 0o700)
	files := os.Getenv("FILES") != ""
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprint("sb-", i)
		p := uint32(i + 1)
		if err := unix.Mkdirat(root, id, 0o700); err != nil {
			b.Fatal(err)
		}
		d, _ := unix.Openat(root, id, dirFlags, 0)
		if err := setProjectID(d, p); err != nil {
			b.Fatal(err)
		}
		if opts != "" {
			usage(root, p)
			setLimits(root, p, 1<<30, 65536)
		}
		unix.Mkdirat(d, "upper", 0o755)
		unix.Mkdirat(d, "work", 0o700)
		unix.Close(d)
		if files {
			b.StopTimer()
			up := filepath.Join(mnt, id, "upper")
			for dd := range 100 {
				os.Mkdir(filepath.Join(up, fmt.Sprint(dd)), 0o755)
				for f := range 100 {
					os.WriteFile(filepath.Join(up, fmt.Sprint(dd), fmt.Sprint(f)), []byte("x"), 0o644)
				}
			}
			b.StartTimer()
		}
		tr := filepath.Join(".trash", id)
		if err := unix.Renameat(root, id, root, tr); err != nil {
			b.Fatal(err)
		}
		d, _ = unix.Openat(root, tr, dirFlags, 0)
		projectID(d)
		unix.Close(d)
		if err := removeTree(context.Background(), root, tr); err != nil {
			b.Fatal(err)
		}
		if opts != "" {
			setLimits(root, p, 0, 0)
		}
	}
}
