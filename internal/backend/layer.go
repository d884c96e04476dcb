package backend

import "os"

// WritableLayer is a sandbox's writable root filesystem layer as a storage
// store hands it out, in one of two forms:
//
//   - host directories: UpperDir and WorkDir, an overlayfs upper and work
//     dir on one host filesystem (quota, if any, enforced there);
//   - a block device: Device, open, with DevicePath (/dev/loopN), holding an
//     ext4 filesystem that the sandbox mounts inside its own mount namespace
//     (the filesystem's size is the quota).
//
// It lives here, not in a backend, so that stores need not import one; a VM
// backend can hand the same device to its guest.
type WritableLayer struct {
	UpperDir, WorkDir string
	// Device keeps the loop device attached until the sandbox has mounted
	// it; the caller closes it then, or on failure.
	Device     *os.File
	DevicePath string
}

// IsDevice reports whether the layer is a block device.
func (l WritableLayer) IsDevice() bool { return l.DevicePath != "" }

// Close releases the layer's device fd, if any; it is safe to call twice.
func (l *WritableLayer) Close() error {
	if l.Device == nil {
		return nil
	}
	err := l.Device.Close()
	l.Device = nil
	return err
}

// UpperLocation says where a sandbox's upper directory lives, for reading
// it from the node: a host directory (Dir), or the disk image (Image)
// holding it as upper/ at the root of its filesystem.
type UpperLocation struct {
	Dir   string
	Image string
	// Scratch, when set, is a fresh path on Dir's filesystem outside
	// every sandbox's quota, where the node may copy the upper directory
	// (reflinked) for a pack; the store removes what is left there at its
	// next open.
	Scratch string
}
