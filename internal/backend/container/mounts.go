package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/userns"
	"golang.org/x/sys/unix"
)

// The sandbox's root is assembled by the node, where the kernel lets it
// mount EROFS and ext4 and make idmapped mounts, and handed to init as
// detached mounts: init, root only inside its user namespace, may do
// neither. Each read-only layer (mounted once per node, owned by host ids
// 0..65535) is seen through an idmapped clone, so the sandbox sees its
// files owned by its own ids 0..65535, and so is the writable layer, whose
// files therefore keep the image's ids on disk (pack needs no shifting).

// layerAttrs are the mount attributes of a layer's idmapped clone.
const layerAttrs = unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV

// diskOpts mount the sandbox's ext4 disk. noinit_itable: the inode tables
// of the fresh filesystem are flagged uninitialised, so the kernel need not
// zero them (which would also fill the sparse image). nobarrier: the
// filesystem's syncs send its loop device no cache flush, which the loop
// turns into an fsync of the image file on the host's disk: that flush
// was the largest wait of a sandbox's exit (its unmount syncs), and the
// image has no journal, so it would buy no crash consistency anyway.
var diskOpts = []string{"noinit_itable", "nobarrier", "nodelalloc"}

// makeMounts makes c.mounts: the root overlay, or in pool mode (init
// mounts its views itself, on tmpfs uppers of its own) the layers.
func (c *creation) makeMounts(ctx context.Context) error {
	ns, err := userns.OpenNS(c.proc.Pid)
	if err != nil {
		return err
	}
	defer ns.Close()
	// The mounts are only fds until init attaches them: whatever fails,
	// closing them is the whole undo.
	c.undo.Push(func() { closeAll(c.mounts); c.mounts = nil })
	for _, l := range c.spec.Layers {
		m, err := userns.IdmapTree(l, ns, layerAttrs)
		if err != nil {
			return fmt.Errorf("layer: %w", err)
		}
		c.mounts = append(c.mounts, m)
	}
	if c.spec.Resettable {
		return nil
	}
	base, upper, work, err := c.upperDirs(ns)
	if err != nil {
		return err
	}
	// The detached mount must outlive the overlay's creation: closing it
	// unmounts it, and the overlay could no longer clone its upper.
	defer base.Close()
	defer upper.Close()
	defer work.Close()
	ovl, err := userns.Overlay(c.mounts, upper, work, c.ids)
	if err != nil {
		return err
	}
	closeAll(c.mounts)
	c.mounts = []*os.File{ovl}
	if c.net != nil {
		// Read-only for the sandbox's root too; it is convenience, the
		// eBPF programs refuse any other resolver whatever it says.
		rc, err := userns.IdmapTree(filepath.Join(c.dir, "resolv.conf"), ns, layerAttrs|unix.MOUNT_ATTR_NOEXEC)
		if err != nil {
			return fmt.Errorf("resolv.conf: %w", err)
		}
		c.mounts = append(c.mounts, rc)
		sys, err := sysfsIn(c.net.Netns())
		if err != nil {
			return err
		}
		c.mounts = append(c.mounts, sys)
	}
	return nil
}

// sysfsIn mounts a read-only sysfs, detached, that shows the network
// namespace netns (its /sys/class/net). Init cannot: the kernel mounts a
// sysfs only for a holder of CAP_SYS_ADMIN over the owner of the network
// namespace, and a pooled one belongs to the node.
func sysfsIn(netns *os.File) (*os.File, error) {
	var m *os.File
	err := netpolicy.InNetns(netns, func() error {
		var err error
		m, err = userns.MountDetached("sysfs", "sysfs", nil,
			unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sysfs for the sandbox's network: %w", err)
	}
	return m, nil
}

// upperDirs opens the overlay's upper and work dirs on an idmapped mount of
// the writable layer: the host dirs of a directory store, or the disk
// device's filesystem, mounted here detached (it lives as long as base or
// the sandbox's overlay does; the loop device goes with it, by autoclear).
func (c *creation) upperDirs(ns *os.File) (base, upper, work *os.File, err error) {
	upperName, workName := "upper", "work"
	if c.layer.IsDevice() {
		base, err = userns.MountDetached("ext4", c.layer.DevicePath, diskOpts, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("mount disk %s: %w", c.layer.DevicePath, err)
		}
		// Made by host root, so owned by id 0 on disk: the sandbox's root.
		for _, d := range []struct {
			name string
			mode uint32
		}{{upperName, 0o755}, {workName, 0o700}} {
			if err := unix.Mkdirat(int(base.Fd()), d.name, d.mode); err != nil && !errors.Is(err, unix.EEXIST) {
				base.Close()
				return nil, nil, nil, fmt.Errorf("mount disk: mkdir %s: %w", d.name, err)
			}
		}
		if err := userns.Idmap(base, ns, 0); err != nil {
			base.Close()
			return nil, nil, nil, fmt.Errorf("disk %s: %w", c.layer.DevicePath, err)
		}
	} else {
		dir := filepath.Dir(c.layer.UpperDir)
		if filepath.Dir(c.layer.WorkDir) != dir {
			return nil, nil, nil, fmt.Errorf("upper %s and work %s must share a directory", c.layer.UpperDir, c.layer.WorkDir)
		}
		upperName, workName = filepath.Base(c.layer.UpperDir), filepath.Base(c.layer.WorkDir)
		if base, err = userns.IdmapTree(dir, ns, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV); err != nil {
			return nil, nil, nil, err
		}
	}
	if upper, err = openDir(base, upperName); err != nil {
		base.Close()
		return nil, nil, nil, err
	}
	if work, err = openDir(base, workName); err != nil {
		base.Close()
		upper.Close()
		return nil, nil, nil, err
	}
	return base, upper, work, nil
}

// openDir opens the directory name right under the mount m, never
// following a symlink.
func openDir(m *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(m.Fd()), name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s of the writable layer: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
