package node

import (
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/state"
)

// checkIO checks a request's disk I/O limits: none negative, none above
// the node's, and only on a backend that applies them (the container
// backend's cgroup blkio / io.max; a microVM's disk is a file its VMM
// writes, a pooled sandbox writes to memory).
func checkIO(backendName string, io, most state.IOLimits) error {
	if io == (state.IOLimits{}) {
		return nil
	}
	if backendName != "container" {
		return errdefs.NotSupported("resources.io: disk I/O limits are applied by the container backend only, not %s", backendName)
	}
	for _, f := range []struct {
		field   string
		v, most int64
		bytes   bool
	}{
		{"resources.io.read_bps", io.ReadBPS, most.ReadBPS, true},
		{"resources.io.write_bps", io.WriteBPS, most.WriteBPS, true},
		{"resources.io.read_iops", io.ReadIOPS, most.ReadIOPS, false},
		{"resources.io.write_iops", io.WriteIOPS, most.WriteIOPS, false},
	} {
		switch {
		case f.v < 0:
			return errdefs.InvalidArgument("%s: %d must not be negative (0 takes the node's limit)", f.field, f.v)
		case f.most > 0 && f.v > f.most && f.bytes:
			return errdefs.InvalidArgument("%s: %s/s is above the node's limit of %s/s", f.field, formatBytes(f.v), formatBytes(f.most))
		case f.most > 0 && f.v > f.most:
			return errdefs.InvalidArgument("%s: %d/s is above the node's limit of %d/s", f.field, f.v, f.most)
		}
	}
	return nil
}
