package container

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"golang.org/x/sys/unix"
)

// DefaultIO is every sandbox's I/O limit on the device of its writable
// layer when Config.IO sets none: roughly a general-purpose cloud disk's
// baseline, far above what builds and test suites sustain, low enough that
// a sandbox writing flat out (O_DIRECT with fsync) leaves the node's disk
// to its neighbours' synchronous writes.
var DefaultIO = cgroup.IOLimits{ReadBPS: 256 << 20, WriteBPS: 128 << 20, ReadIOPS: 4000, WriteIOPS: 2000}

// ioLimits is the node's limits with those a request asked for in place
// (the node refuses a request above its limits; a field the node leaves
// unlimited takes the request's).
func ioLimits(node cgroup.IOLimits, req backend.IOLimits) cgroup.IOLimits {
	pick := func(n, r int64) int64 {
		if r > 0 && (n == 0 || r < n) {
			return r
		}
		return n
	}
	return cgroup.IOLimits{ReadBPS: pick(node.ReadBPS, req.ReadBPS), WriteBPS: pick(node.WriteBPS, req.WriteBPS),
		ReadIOPS: pick(node.ReadIOPS, req.ReadIOPS), WriteIOPS: pick(node.WriteIOPS, req.WriteIOPS)}
}

// limitIO bounds the sandbox's I/O on the block device its writable layer
// lives on (its own disk image's loop device, or the filesystem of the
// store's directories). A resettable sandbox writes to a tmpfs: no device.
func (c *creation) limitIO(ctx context.Context) error {
	if c.spec.Resettable {
		return nil
	}
	var st unix.Stat_t
	var dev uint64
	switch {
	case c.layer.IsDevice():
		if err := unix.Stat(c.layer.DevicePath, &st); err != nil {
			return fmt.Errorf("io limits: %w", err)
		}
		dev = st.Rdev
	case c.layer.UpperDir != "":
		if err := unix.Stat(c.layer.UpperDir, &st); err != nil {
			return fmt.Errorf("io limits: %w", err)
		}
		dev = st.Dev
	default:
		return nil
	}
	if unix.Major(dev) == 0 {
		return nil // a filesystem without a block device (tmpfs, overlay)
	}
	err := c.group.SetIO(unix.Major(dev), unix.Minor(dev), ioLimits(c.b.cfg.IO, c.spec.Resources.IO))
	if errors.Is(err, os.ErrNotExist) {
		c.b.log.Debug("no io controller: sandbox I/O is not limited", "sandbox", c.spec.ID, "err", err)
		return nil
	}
	return err
}
