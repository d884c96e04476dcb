package xfs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// sectorSize is the XFS sector size and the loop device's logical block
// size. 4096 lets the loop device use direct I/O on a 4 KiB host filesystem,
// so layer data is not cached twice (once by XFS, once for the image file).
const sectorSize = 4096

// makeImage creates a sparse image of size bytes at path and formats it as
// XFS. It formats a temporary file and renames it into place, so a crash
// never leaves a half-formatted image under the final name.
func makeImage(ctx context.Context, path string, size int64) error {
	mkfs, err := exec.LookPath("mkfs.xfs")
	if err != nil {
		return errdefs.NotSupported("disk quota: formatting %s: needs mkfs.xfs (xfsprogs)", path)
	}
	tmp := path + ".tmp"
	_ = os.Remove(tmp) // a leftover of a crash during an earlier format
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("size image %s to %d bytes: %w", tmp, size, err)
	}
	// -K: no discard pass (the file is sparse already); -m crc=1 and
	// projid32bit are mkfs defaults but the store relies on them.
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-K", "-m", "crc=1",
		"-i", "projid32bit=1", "-s", "size="+strconv.Itoa(sectorSize), tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("mkfs.xfs %s: %w: %s", tmp, err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("rename formatted image: %w", err)
	}
	return nil
}

// xfsWithoutQuota tells a kernel built without XFS quota (which rejects
// prjquota with EINVAL) from a bad image: it mounts dev read-only without
// options and, if that works, unmounts it again.
func xfsWithoutQuota(dev, dir string) bool {
	if err := unix.Mount(dev, dir, "xfs", unix.MS_RDONLY, ""); err != nil {
		return false
	}
	_ = unix.Unmount(dir, 0)
	return true
}

// findMount returns the topmost mount at mountPoint, or nil.
func findMount(mountPoint string) (*mountinfo.Mount, error) {
	mounts, err := mountinfo.Read()
	if err != nil {
		return nil, err
	}
	var found *mountinfo.Mount
	for i := range mounts {
		if mounts[i].MountPoint == mountPoint {
			found = &mounts[i]
		}
	}
	return found, nil
}
