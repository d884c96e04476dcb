package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// IOLimits bound a group's I/O on one block device, in bytes and
// operations per second; zero leaves that one unlimited.
type IOLimits struct {
	ReadBPS, WriteBPS, ReadIOPS, WriteIOPS int64
}

// SetIO limits the group's I/O on the block device major:minor (v1
// blkio.throttle.*, v2 io.max). On v1, I/O the kernel's flusher threads
// write back for the group is not charged to it (v1 has no writeback
// attribution): direct and synchronous writes are. A host without the
// controller gets an error wrapping os.ErrNotExist.
func (g *Group) SetIO(major, minor uint32, lim IOLimits) error {
	dev := fmt.Sprintf("%d:%d", major, minor)
	if g.unified || g.v1["blkio"] == "" {
		var kv []string
		for _, x := range []struct {
			k string
			v int64
		}{{"rbps", lim.ReadBPS}, {"wbps", lim.WriteBPS}, {"riops", lim.ReadIOPS}, {"wiops", lim.WriteIOPS}} {
			if x.v > 0 {
				kv = append(kv, x.k+"="+strconv.FormatInt(x.v, 10))
			}
		}
		if len(kv) == 0 || g.v2 == "" {
			return nil
		}
		if _, err := os.Stat(filepath.Join(g.v2, "io.max")); err != nil {
			return fmt.Errorf("cgroup %s: io limits: %w", g.id, err)
		}
		return write(g.v2, "io.max", dev+" "+strings.Join(kv, " "))
	}
	for _, x := range []struct {
		file string
		v    int64
	}{{"blkio.throttle.read_bps_device", lim.ReadBPS}, {"blkio.throttle.write_bps_device", lim.WriteBPS},
		{"blkio.throttle.read_iops_device", lim.ReadIOPS}, {"blkio.throttle.write_iops_device", lim.WriteIOPS}} {
		if x.v <= 0 {
			continue
		}
		if err := write(g.v1["blkio"], x.file, dev+" "+strconv.FormatInt(x.v, 10)); err != nil {
			return fmt.Errorf("cgroup %s: io limits: %w", g.id, err)
		}
	}
	return nil
}
