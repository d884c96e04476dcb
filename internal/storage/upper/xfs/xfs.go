package xfs

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/corral-dev/corral/internal/errdefs"
	"golang.org/x/sys/unix"
)

// The kernel ABI this file speaks, from linux/fs.h, linux/quota.h and
// linux/dqblk_xfs.h; golang.org/x/sys/unix has none of it.
const (
	fsIocFsgetxattr    = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIocFssetxattr    = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	fsXflagProjinherit = 0x00000200

	prjQuota     = 2      // PRJQUOTA
	qXGetQuota   = 0x5803 // Q_XGETQUOTA = XQM_CMD(3)
	qXSetQLim    = 0x5804 // Q_XSETQLIM = XQM_CMD(4)
	fsDquotVer   = 1      // FS_DQUOT_VERSION
	fsProjQuota  = 2      // FS_PROJ_QUOTA
	fsDqIsoft    = 1 << 0 // FS_DQ_ISOFT
	fsDqIhard    = 1 << 1 // FS_DQ_IHARD
	fsDqBsoft    = 1 << 2 // FS_DQ_BSOFT
	fsDqBhard    = 1 << 3 // FS_DQ_BHARD
	basicBlock   = 512    // XFS quota limits and counts are in 512-byte units
	fsDqLimitSet = fsDqIsoft | fsDqIhard | fsDqBsoft | fsDqBhard
)

// fsxattr is struct fsxattr (28 bytes).
type fsxattr struct {
	Xflags     uint32
	Extsize    uint32
	Nextents   uint32
	Projid     uint32
	Cowextsize uint32
	Pad        [8]byte
}

// fsDiskQuota is struct fs_disk_quota (112 bytes).
type fsDiskQuota struct {
	Version      int8
	Flags        int8
	Fieldmask    uint16
	ID           uint32
	BlkHardlimit uint64
	BlkSoftlimit uint64
	InoHardlimit uint64
	InoSoftlimit uint64
	Bcount       uint64
	Icount       uint64
	Itimer       int32
	Btimer       int32
	Iwarns       uint16
	Bwarns       uint16
	ItimerHi     int8
	BtimerHi     int8
	RtbtimerHi   int8
	Padding2     int8
	RtbHardlimit uint64
	RtbSoftlimit uint64
	Rtbcount     uint64
	Rtbtimer     int32
	Rtbwarns     uint16
	Padding3     int16
	Padding4     [8]byte
}

// Compile-time layout checks against the C structs.
var (
	_ [28]byte  = [unsafe.Sizeof(fsxattr{})]byte{}
	_ [112]byte = [unsafe.Sizeof(fsDiskQuota{})]byte{}
)

func ioctlPtr(fd int, req uintptr, p unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(p)); e != 0 {
		return e
	}
	return nil
}

// projectID reads the project id of the file open at fd.
func projectID(fd int) (uint32, error) {
	var x fsxattr
	if err := ioctlPtr(fd, fsIocFsgetxattr, unsafe.Pointer(&x)); err != nil {
		return 0, fmt.Errorf("FS_IOC_FSGETXATTR: %w", err)
	}
	return x.Projid, nil
}

// setProjectID gives the directory open at fd project id projid and marks it
// so that everything created below inherits the id.
func setProjectID(fd int, projid uint32) error {
	var x fsxattr
	if err := ioctlPtr(fd, fsIocFsgetxattr, unsafe.Pointer(&x)); err != nil {
		return fmt.Errorf("FS_IOC_FSGETXATTR: %w", err)
	}
	x.Projid = projid
	x.Xflags |= fsXflagProjinherit
	if err := ioctlPtr(fd, fsIocFssetxattr, unsafe.Pointer(&x)); err != nil {
		return fmt.Errorf("FS_IOC_FSSETXATTR projid %d: %w", projid, err)
	}
	return nil
}

// quotactlFd runs quotactl_fd(2) (Linux 5.14) on the filesystem of mntFd, so
// no block device path is needed, for a project quota command.
func quotactlFd(mntFd int, cmd uintptr, id uint32, q *fsDiskQuota) error {
	qcmd := cmd<<8 | prjQuota // QCMD(cmd, PRJQUOTA)
	_, _, e := unix.Syscall6(unix.SYS_QUOTACTL_FD, uintptr(mntFd), qcmd, uintptr(id),
		uintptr(unsafe.Pointer(q)), 0, 0)
	if e != 0 {
		if e == unix.ENOSYS {
			return errdefs.NotSupported("disk quota: quotactl_fd: needs Linux 5.14 or newer")
		}
		return e
	}
	return nil
}

// setLimits sets hard block and inode limits for project projid; zeroes
// clear them. Soft limits are cleared, so no grace timers run.
func setLimits(mntFd int, projid uint32, bytes, inodes int64) error {
	q := fsDiskQuota{
		Version:      fsDquotVer,
		Flags:        fsProjQuota,
		Fieldmask:    fsDqLimitSet,
		ID:           projid,
		BlkHardlimit: uint64((bytes + basicBlock - 1) / basicBlock),
		InoHardlimit: uint64(inodes),
	}
	if err := quotactlFd(mntFd, qXSetQLim, projid, &q); err != nil {
		return fmt.Errorf("Q_XSETQLIM project %d: %w", projid, err)
	}
	return nil
}

// usage returns the bytes and inodes charged to project projid.
func usage(mntFd int, projid uint32) (bytes, inodes int64, err error) {
	var q fsDiskQuota
	if err := quotactlFd(mntFd, qXGetQuota, projid, &q); err != nil {
		if errors.Is(err, unix.ENOENT) { // no dquot: nothing was ever charged
			return 0, 0, nil
		}
		return 0, 0, fmt.Errorf("Q_XGETQUOTA project %d: %w", projid, err)
	}
	return int64(q.Bcount) * basicBlock, int64(q.Icount), nil
}
