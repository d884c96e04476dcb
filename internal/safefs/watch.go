package safefs

import (
	"context"
	"errors"
	"os"
	"path"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// maxWatchDirs bounds the directories one recursive watch holds (each is
// an inotify watch, a host resource counted against max_user_watches).
const maxWatchDirs = 4096

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// WatchDir reports changes in the directory at path with inotify until ctx
// ends. Every directory is first opened inside the root (subdirectories one
// name at a time, never through a symlink) and the watch is added on that
// open fd's /proc/self/fd link, so a watch can never land outside the root.
func (f *FS) WatchDir(ctx context.Context, p string, recursive bool, ready func(), fn func(backend.WatchEvent)) error {
	p, err := cleanPath(p)
	if err != nil {
		return err
	}
	dir, err := f.openIn(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	if err := checkData(dir, p); err != nil {
		dir.Close()
		return err
	}
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		dir.Close()
		return pathErr(p, "inotify_init", err)
	}
	w := &watcher{ino: os.NewFile(uintptr(ifd), "inotify"), names: map[int]string{}, recursive: recursive}
	defer w.ino.Close()
	err = w.add(ctx, dir, "")
	dir.Close()
	if err != nil {
		return pathErr(p, "watch", err)
	}
	if ready != nil {
		ready()
	}
	stop := context.AfterFunc(ctx, func() { _ = w.ino.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 64<<10)
	for {
		n, err := w.ino.Read(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
				return nil
			}
			return pathErr(p, "read inotify", err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 {
				raw := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				name = string(raw[:clen(raw)])
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			w.handle(ctx, f, p, int(ev.Wd), ev.Mask, name, fn)
		}
	}
}

type watcher struct {
	ino       *os.File
	names     map[int]string // watch descriptor -> directory relative to the watched one
	recursive bool
}

// add watches the open directory dir (rel below the watched one) and, when
// recursive, its subdirectories.
func (w *watcher) add(ctx context.Context, dir *os.File, rel string) error {
	if len(w.names) >= maxWatchDirs {
		return errdefs.ResourceExhausted("more than %d directories to watch", maxWatchDirs)
	}
	wd, err := unix.InotifyAddWatch(int(w.ino.Fd()), "/proc/self/fd/"+strconv.Itoa(int(dir.Fd())), watchMask)
	if err != nil {
		return err
	}
	w.names[wd] = rel
	if !w.recursive {
		return nil
	}
	names, err := readNames(ctx, dir, rel)
	if err != nil {
		return err
	}
	for _, name := range names {
		child, err := openChild(dir, name, unix.O_RDONLY|unix.O_DIRECTORY, false)
		if err != nil {
			continue // not a directory, a symlink, or gone
		}
		err = w.add(ctx, child, path.Join(rel, name))
		child.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func (w *watcher) handle(ctx context.Context, f *FS, root string, wd int, mask uint32, name string, fn func(backend.WatchEvent)) {
	if mask&unix.IN_IGNORED != 0 {
		delete(w.names, wd)
		return
	}
	dir, ok := w.names[wd]
	if !ok || name == "" {
		return
	}
	rel := path.Join(dir, name)
	if w.recursive && mask&unix.IN_ISDIR != 0 && mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		if sub, err := f.openIn(path.Join(root, rel), unix.O_RDONLY|unix.O_DIRECTORY, 0); err == nil {
			_ = w.add(ctx, sub, rel)
			sub.Close()
		}
	}
	for _, m := range []struct {
		bit uint32
		op  backend.WatchOp
	}{
		{unix.IN_CREATE | unix.IN_MOVED_TO, backend.WatchCreate},
		{unix.IN_MODIFY, backend.WatchWrite},
		{unix.IN_DELETE, backend.WatchRemove},
		{unix.IN_MOVED_FROM, backend.WatchRename},
		{unix.IN_ATTRIB, backend.WatchChmod},
	} {
		if mask&m.bit != 0 {
			fn(backend.WatchEvent{Name: rel, Op: m.op})
		}
	}
}

func clen(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return len(b)
}
