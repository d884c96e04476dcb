package ext4img

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

const (
	blockSize = 4096 // ext4 block size and the loop device's logical block size
	inodeSize = 256  // ext4 default: room for nanosecond and post-2038 times

	// reservedInodes are the inodes ext4 keeps for itself (1-10) plus
	// lost+found (11); layoutInodes and layoutBlocks are what the overlay
	// layout takes before the sandbox writes anything (upper, work,
	// work/work and a spare). Both are added to the request, so that the
	// sandbox gets what was asked for.
	reservedInodes = 11
	layoutInodes   = 4
	layoutBlocks   = 4

	// slackBlocks is how far above the request the usable space may end
	// up: the image is resized until it lands in [want, want+slack].
	slackBlocks = 32
	// sizeAttempts bounds the mkfs runs for one template.
	sizeAttempts = 4

	// formatVersion names the mkfs recipe in template file names, so a
	// changed recipe never reuses an old template.
	formatVersion = "v1"
)

// mkfsArgs are the fixed mkfs.ext4 arguments: no journal (the filesystem
// lives and dies with one sandbox on one host) and no resize inode; inode
// tables left uninitialised (mounted with noinit_itable, nothing zeroes them
// later) so the image stays sparse; no reserved blocks; root dir owned by
// root.
var mkfsArgs = []string{
	"-q", "-F", "-O", "^has_journal,^resize_inode",
	"-E", "lazy_itable_init=1,nodiscard,root_owner=0:0",
	"-m", "0", "-b", strconv.Itoa(blockSize), "-I", strconv.Itoa(inodeSize), "-L", "corral",
}

// class is what a template is made for: the limits Create was asked for.
type class struct{ bytes, inodes int64 }

// template is one formatted, empty image shared by every sandbox of its
// class; mu serialises its creation.
type template struct {
	mu    sync.Mutex
	path  string
	ready bool
}

// template returns the path of the template for c, formatting it first if
// neither this process nor an earlier one has.
func (s *Store) template(ctx context.Context, c class) (string, error) {
	s.mu.Lock()
	t := s.templates[c]
	if t == nil {
		name := fmt.Sprintf("%s-%d-%d%s", formatVersion, c.bytes, c.inodes, imageExt)
		t = &template{path: filepath.Join(s.dir, templatesDir, name)}
		s.templates[c] = t
	}
	s.mu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ready {
		return t.path, nil
	}
	if _, err := os.Stat(t.path); errors.Is(err, os.ErrNotExist) {
		if err := s.format(ctx, t.path, c); err != nil {
			return "", fmt.Errorf("template %d bytes %d inodes: %w", c.bytes, c.inodes, err)
		}
	} else if err != nil {
		return "", fmt.Errorf("template: %w", err)
	}
	t.ready = true
	return t.path, nil
}

// format makes the template for c at path: it formats <path>.tmp, resizing
// it until the space a sandbox can use is what c asks for, then renames it
// into place, so a crash never leaves a half-made template under its name.
func (s *Store) format(ctx context.Context, path string, c class) error {
	tmp := path + tmpExt
	defer os.Remove(tmp)
	want := ceilDiv(c.bytes, blockSize) + layoutBlocks
	inodes := c.inodes + reservedInodes + layoutInodes
	total := estimateBlocks(want, inodes)
	for range sizeAttempts {
		sb, err := s.mkfsOnce(ctx, tmp, total, inodes)
		if err != nil {
			return err
		}
		got := sb.usableBlocks()
		if got >= want && got <= want+slackBlocks {
			if err := os.Rename(tmp, path); err != nil {
				return fmt.Errorf("rename formatted image: %w", err)
			}
			return nil
		}
		total += want - got
	}
	return fmt.Errorf("mkfs.ext4: no size in %d attempts gives %d usable blocks", sizeAttempts, want)
}

// estimateBlocks guesses the image size in blocks that leaves want blocks
// usable: inode tables, bitmaps and descriptors, and ext4's reserve for
// delayed allocation (2% of the blocks, at most 4096). format corrects it.
func estimateBlocks(want, inodes int64) int64 {
	tables := ceilDiv(inodes*inodeSize, blockSize)
	total := want + tables + 16 + 2*ceilDiv(want+tables, 32768)
	return total + min(ceilDiv(total, 49), 4096)
}

// mkfsOnce (re)creates the sparse file path of the given size and formats
// it; it returns the new superblock.
func (s *Store) mkfsOnce(ctx context.Context, path string, blocks, inodes int64) (superblock, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return superblock{}, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return superblock{}, fmt.Errorf("create image: %w", err)
	}
	err = f.Truncate(blocks * blockSize)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return superblock{}, fmt.Errorf("size image to %d blocks: %w", blocks, err)
	}
	args := append(append([]string{}, mkfsArgs...), "-N", strconv.FormatInt(inodes, 10), path)
	s.mkfsRuns.Add(1)
	if out, err := exec.CommandContext(ctx, s.mkfs, args...).CombinedOutput(); err != nil {
		return superblock{}, fmt.Errorf("mkfs.ext4 %s: %w: %s", path, err, strings.TrimSpace(string(out)))
	}
	return readSuperblock(path)
}

// superblock holds the ext4 superblock fields the store reads.
type superblock struct {
	blocks, freeBlocks, inodes, freeInodes int64
}

// usableBlocks is what anyone can allocate on a fresh mount: the free
// blocks minus the kernel's reserve for delayed allocation (see
// ext4_calculate_resv_clusters); mkfs -m 0 leaves no root reserve.
func (sb superblock) usableBlocks() int64 {
	return sb.freeBlocks - min(sb.blocks/50, 4096)
}

// readSuperblock reads the primary ext4 superblock of the image at path
// (1024 bytes at offset 1024; little-endian; *_hi halves with 64bit).
func readSuperblock(path string) (superblock, error) {
	f, err := os.Open(path)
	if err != nil {
		return superblock{}, err
	}
	defer f.Close()
	b := make([]byte, 1024)
	if _, err := f.ReadAt(b, 1024); err != nil {
		return superblock{}, fmt.Errorf("read superblock of %s: %w", path, err)
	}
	le := binary.LittleEndian
	if magic := le.Uint16(b[0x38:]); magic != 0xEF53 {
		return superblock{}, fmt.Errorf("superblock of %s: bad magic %#x", path, magic)
	}
	if logBlock := le.Uint32(b[0x18:]); 1024<<logBlock != blockSize {
		return superblock{}, fmt.Errorf("superblock of %s: block size %d, want %d", path, 1024<<logBlock, blockSize)
	}
	sb := superblock{
		blocks:     int64(le.Uint32(b[0x04:])),
		freeBlocks: int64(le.Uint32(b[0x0C:])),
		inodes:     int64(le.Uint32(b[0x00:])),
		freeInodes: int64(le.Uint32(b[0x10:])),
	}
	const incompat64bit = 0x80
	if le.Uint32(b[0x60:])&incompat64bit != 0 {
		sb.blocks |= int64(le.Uint32(b[0x150:])) << 32
		sb.freeBlocks |= int64(le.Uint32(b[0x158:])) << 32
	}
	return sb, nil
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
