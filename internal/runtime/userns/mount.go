package userns

import (
	"fmt"
	"os"
	"strings"

	"github.com/corral-dev/corral/internal/runtime/osthread"
	"golang.org/x/sys/unix"
)

// OpenNS opens the user namespace of process pid.
func OpenNS(pid int) (*os.File, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		return nil, fmt.Errorf("open user namespace of %d: %w", pid, err)
	}
	return f, nil
}

// IdmapTree returns a detached copy of the mount at path (rooted at path),
// through which files owned by host ids 0..65535 appear owned by the ids
// that user namespace ns maps them to, and back for writes. attrs adds mount
// attributes (unix.MOUNT_ATTR_RDONLY …).
func IdmapTree(path string, ns *os.File, attrs uint64) (*os.File, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("idmap %s: open_tree: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	if err := Idmap(f, ns, attrs); err != nil {
		f.Close()
		return nil, fmt.Errorf("idmap %s: %w", path, err)
	}
	return f, nil
}

// Idmap idmaps the detached mount m through ns (see IdmapTree).
func Idmap(m, ns *os.File, attrs uint64) error {
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | attrs, Userns_fd: uint64(ns.Fd())}
	if err := unix.MountSetattr(int(m.Fd()), "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("mount_setattr idmap: %w", err)
	}
	return nil
}

// MountDetached mounts source (a block device) with filesystem fstype and
// options opts ("key=value" or "flag") and returns the mount, attached
// nowhere: it lives as long as the returned file or a mount made from it.
func MountDetached(fstype, source string, opts []string, attrs int) (*os.File, error) {
	fsfd, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fsopen %s: %w", fstype, err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "source", source); err != nil {
		return nil, fsError(fsfd, "source", err)
	}
	for _, o := range opts {
		k, v, ok := strings.Cut(o, "=")
		if ok {
			err = unix.FsconfigSetString(fsfd, k, v)
		} else {
			err = unix.FsconfigSetFlag(fsfd, k)
		}
		if err != nil {
			return nil, fsError(fsfd, o, err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, fsError(fsfd, "create", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return nil, fmt.Errorf("fsmount %s: %w", fstype, err)
	}
	return os.NewFile(uintptr(mfd), source), nil
}

// fsError adds the kernel's own message (read from the fs context) to err.
func fsError(fsfd int, what string, err error) error {
	buf := make([]byte, 512)
	if n, rerr := unix.Read(fsfd, buf); rerr == nil && n > 0 {
		return fmt.Errorf("%s: %w (%s)", what, err, strings.TrimSpace(string(buf[:n])))
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Overlay returns a detached overlay of lowers (topmost first) with upper
// and work dirs (fds of directories, all on mounts idmapped to r), ready to
// be moved into the sandbox's mount namespace. The overlay does its own
// work on the layers (copy-up, whiteouts, work dir) with its creator's
// credentials, so it is created as r's root: host root's fsuid 0 has no
// mapping on the idmapped upper and would fail with EOVERFLOW. The node's
// capabilities stay, so trusted.overlay.* xattrs work as without a user
// namespace (and lower layers' opaque directories are honoured).
func Overlay(lowers []*os.File, upper, work *os.File, r Range) (*os.File, error) {
	var m *os.File
	err := AsRoot(r, func() error {
		fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
		if err != nil {
			return fmt.Errorf("fsopen overlay: %w", err)
		}
		defer unix.Close(fsfd)
		// What df and mountinfo show, as for a mount(8) of it.
		if err := unix.FsconfigSetString(fsfd, "source", "overlay"); err != nil {
			return fsError(fsfd, "source", err)
		}
		for _, l := range lowers {
			if err := unix.FsconfigSetFd(fsfd, "lowerdir+", int(l.Fd())); err != nil {
				return fsError(fsfd, "lowerdir+ "+l.Name(), err)
			}
		}
		// Lowers (EROFS) and upper (ext4) are different filesystems:
		// without xino, stat gives a directory an overlay inode number
		// that readdir's d_ino does not match, and st_dev differs across
		// layers. xino=on packs the layer's number into the high bits.
		if err := unix.FsconfigSetString(fsfd, "xino", "on"); err != nil {
			return fsError(fsfd, "xino", err)
		}
		if err := unix.FsconfigSetFd(fsfd, "upperdir", int(upper.Fd())); err != nil {
			return fsError(fsfd, "upperdir", err)
		}
		if err := unix.FsconfigSetFd(fsfd, "workdir", int(work.Fd())); err != nil {
			return fsError(fsfd, "workdir", err)
		}
		if err := unix.FsconfigCreate(fsfd); err != nil {
			return fsError(fsfd, "create", err)
		}
		mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("fsmount overlay: %w", err)
		}
		m = os.NewFile(uintptr(mfd), "overlay")
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("overlay: %w", err)
	}
	return m, nil
}

// AsRoot runs fn on an OS thread of its own whose filesystem uid and gid
// are r's root: files fn creates belong to the sandbox's root. The thread
// keeps its capabilities (a change of fsuid from 0 drops the file
// capabilities from the effective set; they are raised again), and is
// thrown away afterwards rather than handed back to other goroutines. It is
// never the thread group leader, which Go would keep, parked with these ids.
func AsRoot(r Range, fn func() error) error {
	return osthread.Run(func() error { return asRootOnThread(r, fn) })
}

func asRootOnThread(r Range, fn func() error) error {
	if err := unix.Setfsgid(int(r.Host)); err != nil {
		return fmt.Errorf("setfsgid: %w", err)
	}
	if err := unix.Setfsuid(int(r.Host)); err != nil {
		return fmt.Errorf("setfsuid: %w", err)
	}
	if got, _ := unix.SetfsuidRetUid(-1); got != int(r.Host) {
		return fmt.Errorf("setfsuid %d: still %d", r.Host, got)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for i := range data {
		data[i].Effective = data[i].Permitted
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return fn()
}
