package initproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/guest/initproto"
	"golang.org/x/sys/unix"
)

// Pool mode (initproto.Config.Pool): init's root is a small tmpfs holding
// the image layers (read-only bind mounts under /l), the writable layer (a
// size-limited tmpfs on /upper) and the sandbox's view on /v: an overlay of
// both with its own /proc, /dev and /sys. Every command runs chrooted into
// the view (see forker), so a reset can replace the view under a live init.
// With Config.View (a recyclable container sandbox) the view is instead the
// overlay the node made on the sandbox's disk, with the node's shell bound
// in from init's template of it (/sh); there are no /l and /upper, and a
// dirty reset detaches the view until the node sends the next (OpView).
const (
	poolLayers = "/l"
	poolUpper  = "/upper"
	poolView   = "/v"
	poolState  = "/pool.json"
	// Templates of /proc, /sys and /dev's nodes for the views, made
	// while the host's mounts are still visible (see buildRoot).
	poolProc  = "/p"
	poolSys   = "/s"
	poolDev   = "/d"
	poolShell = "/sh"
)

// poolCaps are the capabilities init keeps beyond DefaultCaps in pool mode
// (all of them scoped to the sandbox's user namespace): mounts for reset,
// chroot and bounding-set drops for the forking thread, and lo up in a
// renewed view's fresh network namespace (see forker).
// That thread drops all of them before it forks anything.
var poolCaps = []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_SYS_CHROOT, unix.CAP_SETPCAP, unix.CAP_NET_ADMIN}

// poolConfig is what the serving stage needs of Config in pool mode, kept in
// init's private root (no process inside can reach it).
type poolConfig struct {
	Layers    int    `json:"layers"`
	ViewBytes int64  `json:"view_bytes"`
	Seccomp   []byte `json:"seccomp,omitempty"`
	// View: the node makes the views (Config.View); Shell is then the
	// template of the node's shell, if it gave one.
	View  bool   `json:"view,omitempty"`
	Shell string `json:"shell,omitempty"`
}

// buildPoolRoot makes init's tmpfs root with the layers (mounts, made by
// the node) or the node's view, the templates of the API filesystems and
// the view, and pivots into it.
func buildPoolRoot(cfg *initproto.Config, mounts []int) error {
	unix.Umask(0)
	defer unix.Umask(0o022)
	view := -1
	if cfg.View {
		if len(mounts) != 1 {
			return fmt.Errorf("pool root: got %d mounts, want the node's view alone", len(mounts))
		}
		view, mounts = mounts[0], nil
	} else if len(mounts) == 0 || cfg.ViewBytes <= 0 {
		return errors.New("pool root: needs layers and a view size")
	}
	if !cfg.NoSeccomp && len(cfg.PoolSeccomp) == 0 {
		return errors.New("pool root: the config carries no command filter")
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / rprivate: %w", err)
	}
	root, err := detachedTmpfs("mode=700", "size=1m")
	if err != nil {
		return fmt.Errorf("pool root: %w", err)
	}
	if err := attachRoot(root); err != nil {
		return fmt.Errorf("pool root: %w", err)
	}
	for _, d := range []string{poolLayers, poolUpper, poolView, poolProc, poolSys, poolDev} {
		if err := os.Mkdir("."+d, 0o755); err != nil {
			return fmt.Errorf("pool root: %w", err)
		}
	}
	for i, fd := range mounts {
		dst := fmt.Sprintf(".%s/%d", poolLayers, i)
		if err := os.Mkdir(dst, 0o755); err != nil {
			return fmt.Errorf("pool root: %w", err)
		}
		if err := attach(fd, dst); err != nil {
			return fmt.Errorf("pool root: layer %d: %w", i, err)
		}
	}
	if err := mountTemplates("."); err != nil {
		return err
	}
	if err := mountMqueue("."); err != nil {
		return err
	}
	pc := poolConfig{Layers: len(mounts), ViewBytes: cfg.ViewBytes, Seccomp: cfg.PoolSeccomp, View: cfg.View}
	if cfg.View && cfg.Shell != "" {
		// The host's path is out of reach once pivoted: every view binds
		// this template.
		if err := bindFile(cfg.Shell, "."+poolShell); err != nil {
			return fmt.Errorf("pool root: %w", err)
		}
		pc.Shell = poolShell
	}
	if err := pivot(); err != nil {
		return err
	}
	b, _ := json.Marshal(pc)
	if err := os.WriteFile(poolState, b, 0o600); err != nil {
		return fmt.Errorf("pool root: %w", err)
	}
	if cfg.View {
		err = attachView(&pc, view)
	} else {
		err = mountView(&pc)
	}
	if err != nil {
		return err
	}
	// init's own uses of /proc and /dev (capabilities, /dev/null) go to the
	// view's, whichever mount is current.
	for _, d := range []string{"/proc", "/dev"} {
		if err := os.Symlink(poolView+d, d); err != nil {
			return fmt.Errorf("pool root: %w", err)
		}
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	return loopbackUp()
}

// detachedTmpfs makes a tmpfs mount with options opts, attached nowhere.
func detachedTmpfs(opts ...string) (int, error) {
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen tmpfs: %w", err)
	}
	defer unix.Close(fsfd)
	for _, o := range opts {
		k, v, _ := strings.Cut(o, "=")
		if err := unix.FsconfigSetString(fsfd, k, v); err != nil {
			return -1, fmt.Errorf("tmpfs option %s: %w", o, err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("create tmpfs: %w", err)
	}
	fd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("fsmount tmpfs: %w", err)
	}
	return fd, nil
}

// mountTemplates mounts under root the proc, sysfs and device nodes that
// every view binds (see apiSource). They are never masked, which keeps
// them "fully visible" for the kernel's check on proc and sysfs mounts in a
// user namespace; commands, chrooted into the view, cannot reach them.
func mountTemplates(root string) error {
	const nse = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("proc", root+poolProc, "proc", nse, ""); err != nil {
		return fmt.Errorf("pool root: mount proc: %w", err)
	}
	if err := unix.Mount("sysfs", root+poolSys, "sysfs", nse|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("pool root: mount sysfs: %w", err)
	}
	for _, d := range devNodes {
		if err := bindFile("/dev/"+d, root+poolDev+"/"+d); err != nil {
			return fmt.Errorf("pool root: %w", err)
		}
	}
	return nil
}

// mountView mounts a fresh writable tmpfs and the view over it.
func mountView(pc *poolConfig) error {
	opts := "mode=755,size=" + strconv.FormatInt(pc.ViewBytes, 10)
	if err := unix.Mount("tmpfs", poolUpper, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("view: mount upper tmpfs: %w", err)
	}
	if err := os.Mkdir(poolUpper+"/u", 0o755); err != nil {
		return fmt.Errorf("view: %w", err)
	}
	if err := os.Mkdir(poolUpper+"/w", 0o700); err != nil {
		return fmt.Errorf("view: %w", err)
	}
	lower := make([]string, pc.Layers)
	for i := range lower {
		lower[i] = poolLayers + "/" + strconv.Itoa(i)
	}
	// Mounted in the sandbox's user namespace, the overlay may not use
	// trusted.overlay.* xattrs: userxattr makes it keep its opaque and
	// redirect markers in user.overlay.* on the tmpfs upper (without it,
	// removing a directory of a lower layer fails with EIO). The flip
	// side: lower layers' trusted.overlay.opaque markers are not seen
	// here (see the closing note of issue 8). xino=on: directory inode
	// numbers from stat match readdir's (see userns.Overlay).
	ovl := fmt.Sprintf("lowerdir=%s,upperdir=%s/u,workdir=%s/w,userxattr,xino=on", strings.Join(lower, ":"), poolUpper, poolUpper)
	if err := unix.Mount("overlay", poolView, "overlay", 0, ovl); err != nil {
		return fmt.Errorf("view: mount overlay: %w", err)
	}
	return furnishView(pc)
}

// attachView attaches the node's view fd (closed here) and furnishes it.
func attachView(pc *poolConfig, fd int) error {
	if err := attach(fd, poolView); err != nil {
		return fmt.Errorf("view: %w", err)
	}
	return furnishView(pc)
}

// furnishView mounts the shell and the API filesystems into the view and
// masks them.
func furnishView(pc *poolConfig) error {
	if err := mountShell(poolView, pc.Shell); err != nil {
		return fmt.Errorf("view: %w", err)
	}
	if err := mountAPIFS(poolView, poolAPI); err != nil {
		return fmt.Errorf("view: %w", err)
	}
	return maskPaths(poolView)
}

// unmountView lazily detaches the view (with its submounts) and the upper
// (a node's view has none: its disk goes with the overlay).
func unmountView(pc *poolConfig) error {
	dirs := []string{poolView, poolUpper}
	if pc.View {
		dirs = dirs[:1]
	}
	for _, p := range dirs {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("view: unmount %s: %w", p, err)
		}
	}
	return nil
}

// fingerprint summarises the writable filesystems of the view: used blocks
// and inodes and the root directory's change time of each. Any file
// created, removed, copied up or changed in attributes moves one of them.
type fingerprint [3][4]int64

var writablePaths = [3][2]string{
	{poolUpper, poolUpper + "/u"},
	{poolView + "/dev", poolView + "/dev"},
	{poolView + "/dev/shm", poolView + "/dev/shm"},
}

// takeFingerprint summarises pc's view. A node's view has no tmpfs upper of
// init's: the overlay itself reports its writable layer (statfs gives the
// upper filesystem's figures, the root's ctime the upper root's).
func takeFingerprint(pc *poolConfig) (fingerprint, error) {
	var fp fingerprint
	paths := writablePaths
	if pc.View {
		paths[0] = [2]string{poolView, poolView}
	}
	for i, p := range paths {
		var fs unix.Statfs_t
		if err := unix.Statfs(p[0], &fs); err != nil {
			return fp, fmt.Errorf("statfs %s: %w", p[0], err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(p[1], &st); err != nil {
			return fp, fmt.Errorf("stat %s: %w", p[1], err)
		}
		fp[i] = [4]int64{int64(fs.Blocks - fs.Bfree), int64(fs.Files - fs.Ffree), st.Ctim.Sec, st.Ctim.Nsec}
	}
	return fp, nil
}

// loadPool reads the serving stage's pool config and starts the forker.
func loadPool() (*pool, error) {
	b, err := os.ReadFile(poolState)
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	var pc poolConfig
	if err := json.Unmarshal(b, &pc); err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	cursor, err := openPidCursor()
	if err != nil {
		return nil, err
	}
	p := &pool{cfg: pc, cursor: cursor}
	// The first forker serves in init's own namespace, new with the sandbox.
	if err := p.renew(false); err != nil {
		return nil, err
	}
	return p, nil
}
