// Package loopdev attaches image files to loop devices and tells which loop
// devices an image is attached to. Every device it attaches has
// LO_FLAGS_AUTOCLEAR: the kernel detaches it when its last user (the fd
// Attach returns, then whatever mounts it) lets go, so nothing here needs
// an explicit detach and a crash leaks no device. It owns no state. It must
// not import corral packages other than internal/errdefs.
package loopdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"golang.org/x/sys/unix"
)

// maxAttempts bounds the LOOP_CTL_GET_FREE / LOOP_CONFIGURE race with other
// processes that grab the same free device.
const maxAttempts = 32

// Attach binds image to a free loop device (LOOP_CTL_GET_FREE, then
// LOOP_CONFIGURE) with autoclear and, when the image's filesystem supports
// it, direct I/O (so its data is not cached twice), and returns the open
// device; its Name is the device path (/dev/loopN). blockSize is the
// device's logical block size (512, 1024, 2048 or 4096).
func Attach(image string, blockSize uint32) (*os.File, error) {
	img, err := unix.Open(image, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open image: %w", err)
	}
	defer unix.Close(img)
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, errdefs.NotSupported("loop devices: needs /dev/loop-control (CONFIG_BLK_DEV_LOOP)")
		}
		return nil, fmt.Errorf("open /dev/loop-control: %w", err)
	}
	defer unix.Close(ctl)
	cfg := unix.LoopConfig{Fd: uint32(img), Size: blockSize}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], image)
	for range maxAttempts {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		f, err := configure(dev, n, &cfg)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EBUSY) { // EBUSY: another process took it first
			return nil, err
		}
	}
	return nil, errdefs.Unavailable("loop devices: no free device after %d attempts", maxAttempts)
}

// configure opens dev and binds it with cfg, dropping direct I/O when the
// image's filesystem refuses it (EINVAL); cfg keeps that choice for the
// next attempt.
func configure(dev string, n int, cfg *unix.LoopConfig) (*os.File, error) {
	fd, err := openDev(dev, n)
	if err != nil {
		return nil, err
	}
	err = unix.IoctlLoopConfigure(fd, cfg)
	if errors.Is(err, unix.EINVAL) && cfg.Info.Flags&unix.LO_FLAGS_DIRECT_IO != 0 {
		cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
		err = unix.IoctlLoopConfigure(fd, cfg)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err)
	}
	return os.NewFile(uintptr(fd), dev), nil
}

// openDev opens /dev/loopN, creating the node when /dev is not devtmpfs.
func openDev(dev string, n int) (int, error) {
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("mknod %s: %w", dev, err)
		}
		fd, err = unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", dev, err)
	}
	return fd, nil
}

// BackingFile returns the image a loop device (/dev/loopN) is bound to, or
// "" when it is detached.
func BackingFile(dev string) string {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop/backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Holders returns the loop devices bound to image (an absolute path with
// symlinks resolved, as the kernel reports it), including one whose image
// was deleted under it.
func Holders(image string) ([]string, error) {
	devs, err := filepath.Glob("/sys/block/loop*")
	if err != nil {
		return nil, fmt.Errorf("list loop devices: %w", err)
	}
	var held []string
	for _, d := range devs {
		back := BackingFile(d)
		if back == image || back == image+" (deleted)" {
			held = append(held, "/dev/"+filepath.Base(d))
		}
	}
	return held, nil
}

// WaitDetached waits up to timeout (or ctx) until dev is detached. With
// autoclear it already is once its last user is gone; an error means
// something still holds it (a mount, possibly in another namespace, or an
// open fd).
func WaitDetached(ctx context.Context, dev string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for BackingFile(dev) != "" {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errdefs.FailedPrecondition("loop device %s: still attached after %v: "+
				"still in use (a mount, maybe in another namespace, or an open fd)", dev, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}
