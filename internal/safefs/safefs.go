// Package safefs serves file operations on a directory tree that an
// untrusted program controls — a sandbox's root seen from the host through
// /proc/<pid>/root — without ever touching anything outside that tree.
//
// Every path walk is one openat2(2) call relative to a freshly opened root
// fd with RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS: "..", absolute and relative
// symlinks all resolve inside the root, /proc magic links are refused, and a
// symlink the sandbox swaps in between two calls can at worst redirect an
// operation to another place inside the root. Operations then act on the
// resulting fds (fstat, getdents, fchmod) or on a single name relative to a
// parent fd (mkdirat, unlinkat, fstatat with AT_SYMLINK_NOFOLLOW); no host
// path string is ever built.
//
// RESOLVE_NO_XDEV is deliberately not used for lookups: a sandbox's tree has
// its own mounts (/proc, /dev, /tmp, workspace binds) that callers must
// reach, and RESOLVE_IN_ROOT already keeps every walk below the root
// whatever mounts it crosses. Mounts matter in two other places. Remove
// never unlinks a mount point (from outside the sandbox's mount namespace
// the kernel would allow it and silently detach the sandbox's mount) and a
// recursive Remove does not descend into other mounts. And content or
// namespace changes on kernel pseudo filesystems (proc, sysfs, cgroup, ...)
// are refused, as are reads there, because the node acts with host
// privileges and files there are the host kernel's interfaces.
//
// Semantics in short: a symlink as the last element is followed (inside the
// root) by ReadFile, WriteFile and ListDir, not by Stat and Remove; only
// regular files are read or written, never FIFOs or devices; the FS acts as
// the calling process (host root for the node), so sandbox permissions do
// not limit it; see WithOwner for the owner of what it creates.
//
// Archive and Extract move whole trees as tar streams under the same rules
// (archive.go, extract.go): each entry is reached or made by one name in
// its parent's fd, never through a symlink.
//
// The package imports only internal/errdefs and internal/backend types.
package safefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// maxPath is the longest path accepted, in bytes (PATH_MAX).
const maxPath = 4096

// resolveFlags confine every path walk to the root. RESOLVE_IN_ROOT treats
// the root fd as "/" for "..", absolute symlinks and absolute paths;
// RESOLVE_NO_MAGICLINKS refuses /proc/<pid>/{root,cwd,exe,fd/*} style links,
// which would jump to an arbitrary file of the host.
const resolveFlags = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// FS implements backend.Files for a root directory. It is safe for
// concurrent use.
type FS struct {
	open     func() (*os.File, error)
	uid, gid int // owner of created files and directories; -1: unchanged
}

var _ backend.Files = (*FS)(nil)

// Option configures an FS.
type Option func(*FS)

// WithOwner makes files and directories the FS creates owned by uid:gid (as
// seen from the caller), e.g. the host uid that a user-namespaced sandbox
// maps to its root, so that the sandbox can change them afterwards.
func WithOwner(uid, gid int) Option {
	return func(f *FS) { f.uid, f.gid = uid, gid }
}

// New returns an FS whose root is opened by open for each operation (e.g.
// /proc/<pid>/root with O_PATH|O_DIRECTORY). Opening per operation means no
// fd pins the sandbox's mount namespace between calls.
func New(open func() (*os.File, error), opts ...Option) *FS {
	f := &FS{open: open, uid: -1, gid: -1}
	for _, o := range opts {
		o(f)
	}
	return f
}

// root opens the root directory for one operation.
func (f *FS) root() (*os.File, error) {
	r, err := f.open()
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errdefs.FailedPrecondition("sandbox root is gone: %v", err)
		}
		return nil, fmt.Errorf("open sandbox root: %w", err)
	}
	return r, nil
}

// cleanPath validates p (field "path") and returns it cleaned, absolute.
func cleanPath(p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.InvalidArgument("path: must not be empty")
	case len(p) > maxPath:
		return "", errdefs.InvalidArgument("path: longer than %d bytes", maxPath)
	case strings.IndexByte(p, 0) >= 0:
		return "", errdefs.InvalidArgument("path %q: contains a NUL byte", p)
	case !strings.HasPrefix(p, "/"):
		return "", errdefs.InvalidArgument("path %q: must be absolute", p)
	}
	return path.Clean(p), nil
}

// rel turns a clean absolute path into the form openat2 takes relative to
// the root fd ("." for the root itself).
func rel(p string) string {
	if p == "/" {
		return "."
	}
	return p[1:]
}

// openat2 opens p relative to dirfd, retrying the EAGAIN that
// RESOLVE_IN_ROOT returns when a concurrent rename races a ".." step.
func openat2(dirfd int, p string, flags uint64, mode uint32, resolve uint64) (*os.File, error) {
	how := unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Mode: uint64(mode), Resolve: resolve}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, p, &how)
		if err == nil {
			return os.NewFile(uintptr(fd), p), nil
		}
		if (err == unix.EAGAIN || err == unix.EINTR) && i < 64 {
			continue
		}
		return nil, err
	}
}

// at resolves p (clean, absolute) inside root and opens it. Syscall
// errors are returned raw (unix.Errno) for the caller to inspect.
func at(root *os.File, p string, flags uint64, mode uint32) (*os.File, error) {
	return openat2(int(root.Fd()), rel(p), flags, mode, resolveFlags)
}

// openIn opens a fresh root and resolves p (clean, absolute) inside it.
func (f *FS) openIn(p string, flags uint64, mode uint32) (*os.File, error) {
	root, err := f.root()
	if err != nil {
		return nil, err
	}
	defer root.Close()
	file, err := at(root, p, flags, mode)
	if err != nil {
		return nil, pathErr(p, "open", err)
	}
	return file, nil
}

// openParent resolves the directory holding p's last element and returns it
// as an O_PATH fd with that element's name. p must not be "/".
func (f *FS) openParent(p string) (*os.File, string, error) {
	root, err := f.root()
	if err != nil {
		return nil, "", err
	}
	defer root.Close()
	dir, name := path.Split(p)
	parent, err := at(root, path.Clean(dir), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, "", pathErr(p, "open parent", err)
	}
	return parent, name, nil
}

// openDataParent is openParent for a change to p's entry: the parent must
// not be on a kernel pseudo filesystem.
func (f *FS) openDataParent(p string) (*os.File, string, error) {
	parent, name, err := f.openParent(p)
	if err != nil {
		return nil, "", err
	}
	if err := checkData(parent, p); err != nil {
		parent.Close()
		return nil, "", err
	}
	return parent, name, nil
}

// openEntryParent is openDataParent for a call that changes the entry at
// the caller's path p (cleaned and returned as clean): the root is refused
// with onRoot, and a done ctx stops it before anything is opened.
func (f *FS) openEntryParent(ctx context.Context, p, onRoot string) (parent *os.File, name, clean string, err error) {
	if clean, err = cleanPath(p); err != nil {
		return nil, "", "", err
	}
	if clean == "/" {
		return nil, "", "", errdefs.InvalidArgument("path %q: %s", clean, onRoot)
	}
	if err := live(ctx); err != nil {
		return nil, "", "", err
	}
	parent, name, err = f.openDataParent(clean)
	return parent, name, clean, err
}

// openChild opens the single entry name of dir without following a symlink
// or a magic link; with sameMount it also refuses to cross into another
// mount (used while walking a tree being removed).
func openChild(dir *os.File, name string, flags uint64, sameMount bool) (*os.File, error) {
	resolve := uint64(unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS)
	if sameMount {
		resolve |= unix.RESOLVE_NO_XDEV
	}
	return openat2(int(dir.Fd()), name, flags|unix.O_NOFOLLOW, 0, resolve)
}

// pseudoFS names the kernel filesystems whose files are kernel interfaces,
// not data: writing them as the host's root would reach the host kernel
// (sysctls, cgroups, tracing), and reading them returns host state.
var pseudoFS = map[int64]string{
	unix.PROC_SUPER_MAGIC:    "proc",
	unix.SYSFS_MAGIC:         "sysfs",
	unix.CGROUP_SUPER_MAGIC:  "cgroup",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2",
	unix.DEBUGFS_MAGIC:       "debugfs",
	unix.TRACEFS_MAGIC:       "tracefs",
	unix.SECURITYFS_MAGIC:    "securityfs",
	unix.BPF_FS_MAGIC:        "bpf",
	unix.BINFMTFS_MAGIC:      "binfmt_misc",
	unix.EFIVARFS_MAGIC:      "efivarfs",
	unix.PSTOREFS_MAGIC:      "pstore",
	unix.SELINUX_MAGIC:       "selinuxfs",
	unix.SMACK_MAGIC:         "smackfs",
	unix.NSFS_MAGIC:          "nsfs",
	0x65735543:               "fusectl",
	0x62656570:               "configfs",
}

// checkData refuses a file or directory on a kernel pseudo filesystem.
func checkData(file *os.File, p string) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(file.Fd()), &st); err != nil {
		return pathErr(p, "statfs", err)
	}
	if name, ok := pseudoFS[int64(st.Type)]; ok {
		return errdefs.PermissionDenied("path %q: on a kernel filesystem (%s); use exec to reach it", p, name)
	}
	return nil
}

// live returns ctx's error; an expired deadline also carries
// errdefs.ErrDeadlineExceeded.
func live(ctx context.Context) error {
	err := ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", errdefs.ErrDeadlineExceeded, err)
	}
	return err
}
