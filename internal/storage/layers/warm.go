package layers

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// A memory cgroup is charged for a page cache page by the task that first
// brings it in. A layer mount is shared by every sandbox of its image, so
// without care the first sandbox to run a command pays for the image's
// binaries and libraries, and when that sandbox reaches its memory limit
// (a memory bomb) its cgroup reclaims them: every other sandbox of the
// image then faults them back from disk. So the node reads a layer's files
// itself right after mounting it, before any sandbox can see the mount,
// and the pages are charged to the node's cgroup.
//
// Layers whose blob is fetched lazily are not read: that would download
// the whole blob, which lazy loading exists to avoid.

// DefaultWarmBudget is how many bytes of a layer's files the node reads
// after mounting it: the executables and shared libraries first, then the
// rest in path order. It bounds the one-time stall of that first mount
// (creates wait for it) and the page cache the node takes on.
const DefaultWarmBudget = 128 << 20

// WithWarmBudget sets how many bytes of each newly mounted layer the node
// reads into the page cache (0: none).
func WithWarmBudget(bytes int64) Option {
	return func(s *Store) { s.warmBudget = bytes }
}

// warmLayer reads up to budget bytes of the files under mp into the page
// cache. A file that cannot be read is skipped: warming is an
// optimisation, the mount is usable without it.
func warmLayer(ctx context.Context, mp string, budget int64) error {
	if budget <= 0 {
		return nil
	}
	// hot: executables and shared libraries, mapped by most commands;
	// each list keeps the walk's path order.
	var hot, rest []string
	err := filepath.WalkDir(mp, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // an unreadable directory: skip it
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Size() == 0 {
			return nil
		}
		if name := d.Name(); info.Mode().Perm()&0o111 != 0 || strings.HasSuffix(name, ".so") || strings.Contains(name, ".so.") {
			hot = append(hot, path)
		} else {
			rest = append(rest, path)
		}
		return nil
	})
	if err != nil {
		return err
	}
	buf := make([]byte, 256<<10)
	var read int64
	for _, path := range append(hot, rest...) {
		if read >= budget {
			break
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		n, _ := readFile(path, buf, budget-read)
		read += n
	}
	return nil
}

// readFile reads up to limit bytes of the regular file at path into buf,
// never following a symbolic link or blocking on a special file.
func readFile(path string, buf []byte, limit int64) (int64, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var read int64
	for read < limit {
		n, err := f.Read(buf[:min(int64(len(buf)), limit-read)])
		read += int64(n)
		if errors.Is(err, io.EOF) {
			return read, nil
		}
		if err != nil {
			return read, err
		}
	}
	return read, nil
}
