package ext4img

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// copySparse makes dst (which must not exist) a copy of src that shares or
// skips src's holes: a reflink (FICLONE) where the host filesystem has
// them, else the data ranges (SEEK_DATA/SEEK_HOLE) with copy_file_range.
// On error dst is removed.
func (s *Store) copySparse(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("open template: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err // the caller maps EEXIST
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if !s.noReflink.Load() {
		err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EXDEV) &&
			!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
			return fmt.Errorf("FICLONE: %w", err)
		}
		s.noReflink.Store(true)
	}
	return copyData(in, out)
}

// copyData sizes out like in and copies in's data ranges to the same
// offsets, leaving the holes unwritten.
func copyData(in, out *os.File) error {
	st, err := in.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	if err := out.Truncate(size); err != nil {
		return fmt.Errorf("size copy: %w", err)
	}
	inFd, outFd := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < size; {
		start, err := unix.Seek(inFd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // no data after off
			return nil
		}
		if err != nil {
			return fmt.Errorf("SEEK_DATA: %w", err)
		}
		end, err := unix.Seek(inFd, start, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("SEEK_HOLE: %w", err)
		}
		if err := copyRange(inFd, outFd, start, end); err != nil {
			return err
		}
		off = end
	}
	return nil
}

// copyRange copies [start, end) of in to the same offsets of out.
func copyRange(in, out int, start, end int64) error {
	roff, woff := start, start
	for roff < end {
		n, err := unix.CopyFileRange(in, &roff, out, &woff, int(min(end-roff, 1<<30)), 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("copy_file_range: %w", err)
		}
		if n == 0 {
			return fmt.Errorf("copy_file_range: %w at %d of %d", io.ErrUnexpectedEOF, roff, end)
		}
	}
	return nil
}
