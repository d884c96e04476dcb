package quota

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
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

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	mountPoint, fsType, source, superOpts string
}

// findMount returns the topmost mount at mountPoint, or nil.
func findMount(mountPoint string) (*mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	var found *mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || len(fields) < sep+4 {
			continue
		}
		if unescapeOctal(fields[4]) == mountPoint {
			found = &mountEntry{
				mountPoint: mountPoint,
				fsType:     fields[sep+1],
				source:     unescapeOctal(fields[sep+2]),
				superOpts:  fields[sep+3],
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return found, nil
}

// unescapeOctal undoes mountinfo's \ooo escapes of space, tab, newline and \.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func hasOpt(opts, want string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}
