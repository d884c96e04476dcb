// Package swaparea owns the node's swap file: the place where a paused
// sandbox's memory goes when it is reclaimed (pause --reclaim). It makes
// the file under the node's data dir, writes the swap header and enables
// it with swapon(2), and disables and removes it at exit, or at the next
// start after a crash. It imports nothing from corral but errdefs.
package swaparea

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// minBytes is the smallest area worth making (the kernel wants ten pages).
const minBytes = 16 << 20

// Area is an enabled swap file.
type Area struct {
	path  string
	bytes int64
	log   *slog.Logger
}

// Path is where the node's swap file lives under dataDir.
func Path(dataDir string) string { return filepath.Join(dataDir, "swap", "swapfile") }

// Setup makes and enables a swap file of size bytes under dataDir,
// first disabling and removing one a crashed daemon left there.
func Setup(dataDir string, size int64, log *slog.Logger) (*Area, error) {
	page := int64(os.Getpagesize())
	if size < minBytes {
		return nil, errdefs.InvalidArgument("swap: %d bytes is under the minimum of %d", size, minBytes)
	}
	size -= size % page
	path := Path(dataDir)
	if err := Remove(path, log); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("swap dir: %w", err)
	}
	if err := makeFile(path, size, page); err != nil {
		_ = os.Remove(path)
		return nil, err
	}
	if err := swapon(path); err != nil {
		_ = os.Remove(path)
		return nil, err
	}
	log.Info("swap area enabled", "path", path, "bytes", size)
	return &Area{path: path, bytes: size, log: log}, nil
}

// Bytes is the area's size.
func (a *Area) Bytes() int64 { return a.bytes }

// Close disables the area (the kernel reads every page in it back into
// RAM first) and removes the file. A nil Area is none: Close does nothing.
func (a *Area) Close() error {
	if a == nil {
		return nil
	}
	return Remove(a.path, a.log)
}

// Remove disables (when enabled) and deletes the swap file at path; a
// missing file is not an error.
func Remove(path string, log *slog.Logger) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if active(path) {
		if err := swapCall(unix.SYS_SWAPOFF, path); err != nil {
			return fmt.Errorf("swapoff %s: %w", path, err)
		}
		log.Info("swap area disabled", "path", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove swap file: %w", err)
	}
	return nil
}

// active reports whether path is in /proc/swaps.
func active(path string) bool {
	data, err := os.ReadFile("/proc/swaps")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 0 && f[0] == path {
			return true
		}
	}
	return false
}

// makeFile writes a swap file of size bytes: allocated blocks (swapon
// refuses holes) and a version-1 header in the first page.
func makeFile(path string, size, page int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create swap file: %w", err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		// Filesystems without fallocate get the blocks written.
		zero := make([]byte, 1<<20)
		for off := int64(0); off < size; off += int64(len(zero)) {
			if _, err := f.WriteAt(zero[:min(int64(len(zero)), size-off)], off); err != nil {
				return fmt.Errorf("write swap file: %w", err)
			}
		}
	}
	// The header (linux/swap.h, union swap_header): version, last page
	// and no bad pages after 1024 boot bytes; the signature ends the page.
	hdr := make([]byte, page)
	binary.LittleEndian.PutUint32(hdr[1024:], 1)
	binary.LittleEndian.PutUint32(hdr[1028:], uint32(size/page-1))
	copy(hdr[page-10:], "SWAPSPACE2")
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return fmt.Errorf("write swap header: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync swap file: %w", err)
	}
	return nil
}

func swapon(path string) error {
	err := swapCall(unix.SYS_SWAPON, path)
	if errors.Is(err, unix.EPERM) {
		return errdefs.PermissionDenied("%v (needs root: CAP_SYS_ADMIN)", err)
	}
	return err
}

// swapCall is swapon(2) (no flags) or swapoff(2); x/sys/unix wraps neither.
func swapCall(nr uintptr, path string) error {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(nr, uintptr(unsafe.Pointer(p)), 0, 0); errno != 0 {
		name := "swapon"
		if nr == unix.SYS_SWAPOFF {
			name = "swapoff"
		}
		return fmt.Errorf("%s %s: %w", name, path, errno)
	}
	return nil
}
