package vm

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Firmware is how a VM image boots.
const (
	// FirmwareBIOS boots the disk's own boot loader through SeaBIOS.
	FirmwareBIOS = "bios"
	// FirmwareUEFI boots the disk's EFI system partition through OVMF.
	FirmwareUEFI = "uefi"
	// FirmwareDirect boots the kernel and initrd kept beside the disk
	// (QEMU -kernel; the images `vm-image build` makes).
	FirmwareDirect = "direct"
)

// Files of an image directory <images>/<name>@<version>/.
const (
	imageMeta   = "image.json"
	imageKernel = "vmlinuz"
	imageInitrd = "initrd.img"
)

// refPattern is NAME@VERSION, as for layers.
var refPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}@[A-Za-z0-9._-]{1,64}$`)

// Image is one VM image: a disk that sandboxes use as the backing file
// of their own copy-on-write overlay.
type Image struct {
	Ref      string `json:"ref"`
	Format   string `json:"format"` // qcow2 or raw
	Firmware string `json:"firmware"`
	// Disk is the disk file's name in the image directory.
	Disk string `json:"disk"`
	// VirtualSize is the disk's size as the guest sees it; FileSize what
	// it takes on the node.
	VirtualSize int64 `json:"virtual_size"`
	FileSize    int64 `json:"file_size"`
	// Cmdline is the kernel command line of a direct-boot image.
	Cmdline string    `json:"cmdline,omitempty"`
	Source  string    `json:"source"`
	Created time.Time `json:"created"`
	// Agent: the image runs corral-agent as a service on agentPortName
	// (the images `vm-image build` makes); exec and files then go through
	// it instead of qemu-ga.
	Agent bool `json:"agent,omitempty"`
	// PortHandshake: the image's agent starts each connection to its port
	// with the handshake (agentproto.SyncPort); the agent of an image built
	// before it speaks yamux at once.
	PortHandshake bool `json:"port_handshake,omitempty"`

	dir string
}

// Path is a file of the image's directory.
func (im Image) Path(name string) string { return filepath.Join(im.dir, name) }

// Images is the node's store of VM images, one directory each.
type Images struct {
	dir string
	// inUse names the sandboxes using a ref (Remove refuses while any do).
	inUse func(ref string) []string
	// agentPath is the corral-agent that builds install ("": beside the
	// running executable).
	agentPath string
	mu        sync.Mutex
}

func openImages(dir string, inUse func(string) []string) (*Images, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("vm images: %w", err)
	}
	// Half-finished imports and builds of an earlier run.
	tmps, _ := filepath.Glob(filepath.Join(dir, ".tmp-*"))
	for _, t := range tmps {
		_ = os.RemoveAll(t)
	}
	return &Images{dir: dir, inUse: inUse}, nil
}

func checkRef(ref string) error {
	if !refPattern.MatchString(ref) {
		return errdefs.InvalidArgument("name: %q is not NAME@VERSION (lower-case name, up to 64 characters each)", ref)
	}
	return nil
}

// List returns every image, by ref.
func (s *Images) List() ([]Image, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("vm images: %w", err)
	}
	var out []Image
	for _, e := range ents {
		if im, err := s.load(e.Name()); err == nil {
			out = append(out, im)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref < out[j].Ref })
	return out, nil
}

func (s *Images) load(ref string) (Image, error) {
	if checkRef(ref) != nil {
		return Image{}, errdefs.NotFound("vm image %q: not found", ref)
	}
	dir := filepath.Join(s.dir, ref)
	b, err := os.ReadFile(filepath.Join(dir, imageMeta))
	if err != nil {
		return Image{}, errdefs.NotFound("vm image %s: not found (corral vm-image ls lists them; vm-image build debian or vm-image import makes one)", ref)
	}
	var im Image
	if err := json.Unmarshal(b, &im); err != nil {
		return Image{}, fmt.Errorf("vm image %s: %w", ref, err)
	}
	im.dir = dir
	return im, nil
}

// Get resolves NAME@VERSION, or NAME alone to its newest version.
func (s *Images) Get(name string) (Image, error) {
	if strings.Contains(name, "@") {
		return s.load(name)
	}
	all, err := s.List()
	if err != nil {
		return Image{}, err
	}
	var best Image
	for _, im := range all {
		if strings.HasPrefix(im.Ref, name+"@") && (best.Ref == "" || im.Created.After(best.Created)) {
			best = im
		}
	}
	if best.Ref == "" {
		return Image{}, errdefs.NotFound("vm image %q: not found (corral vm-image ls lists them; vm-image build debian or vm-image import makes one)", name)
	}
	return best, nil
}

// Remove deletes an image no sandbox uses.
func (s *Images) Remove(ref string) error {
	if err := checkRef(ref); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.load(ref); err != nil {
		return err
	}
	if users := s.inUse(ref); len(users) > 0 {
		return errdefs.FailedPrecondition("vm image %s: in use by %d sandbox(es) (%s); delete them first", ref, len(users), strings.Join(users[:min(3, len(users))], ", "))
	}
	if err := os.RemoveAll(filepath.Join(s.dir, ref)); err != nil {
		return fmt.Errorf("vm image %s: remove: %w", ref, err)
	}
	return nil
}

// install moves a finished temporary image directory into place.
func (s *Images) install(tmp string, im Image) (Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, _ := json.MarshalIndent(im, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, imageMeta), b, 0o600); err != nil {
		return Image{}, fmt.Errorf("vm image %s: %w", im.Ref, err)
	}
	dst := filepath.Join(s.dir, im.Ref)
	if err := os.Rename(tmp, dst); err != nil {
		if errors.Is(err, os.ErrExist) || isNotEmpty(err) {
			return Image{}, errdefs.AlreadyExists("vm image %s: exists (vm-image rm it first, or pick another version)", im.Ref)
		}
		return Image{}, fmt.Errorf("vm image %s: %w", im.Ref, err)
	}
	im.dir = dst
	return im, nil
}

func isNotEmpty(err error) bool {
	var le *os.LinkError
	return errors.As(err, &le) && strings.Contains(le.Err.Error(), "not empty")
}

func (s *Images) tempDir() (string, error) {
	return os.MkdirTemp(s.dir, ".tmp-")
}

// diskInfo is what qemu-img info says of a file.
type diskInfo struct {
	Format          string `json:"format"`
	VirtualSize     int64  `json:"virtual-size"`
	ActualSize      int64  `json:"actual-size"`
	BackingFilename string `json:"backing-filename"`
	FormatSpecific  struct {
		Data struct {
			DataFile string `json:"data-file"`
		} `json:"data"`
	} `json:"format-specific"`
}

// qemuImgInfo runs qemu-img info on path as format ("": let qemu-img
// probe; only for disks the node made itself).
func qemuImgInfo(ctx context.Context, path string, format ...string) (diskInfo, error) {
	var di diskInfo
	args := []string{"info", "--output=json"}
	if len(format) > 0 {
		args = append(args, "-f", format[0])
	}
	out, err := exec.CommandContext(ctx, "qemu-img", append(args, path)...).Output()
	if err != nil {
		msg := err.Error()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			msg = strings.TrimSpace(string(ee.Stderr))
		}
		return di, errdefs.InvalidArgument("file: not a disk image: qemu-img info: %s", msg)
	}
	if err := json.Unmarshal(out, &di); err != nil {
		return di, fmt.Errorf("qemu-img info: %w", err)
	}
	return di, nil
}

// qcow2 header fields (the format's specification, version 2 and 3).
const (
	qcow2Magic          = "QFI\xfb"
	qcow2IncompatOffset = 72     // incompatible_features, version 3
	qcow2ExternalData   = 1 << 2 // incompatible feature: data in another file
)

// sniffFormat tells an uploaded disk's format from its first bytes,
// before any qemu tool opens it: a probe would follow what the file
// names, and a qcow2's backing or data file, a VMDK's extents, are paths
// on the node. A qcow2 naming such a file is refused here; other formats
// qemu knows are refused by name; anything else is raw.
func sniffFormat(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var h [4096]byte // the header and, as qemu-img writes it, the backing file's name
	n, _ := io.ReadFull(f, h[:])
	head := h[:n]
	switch {
	case bytes.HasPrefix(head, []byte(qcow2Magic)) && n >= qcow2IncompatOffset+8:
		version := binary.BigEndian.Uint32(head[4:])
		backingOffset := binary.BigEndian.Uint64(head[8:])
		if backingOffset != 0 {
			name := ""
			if size := binary.BigEndian.Uint32(head[16:]); backingOffset+uint64(size) <= uint64(n) && size <= 1023 {
				name = string(head[backingOffset : backingOffset+uint64(size)])
			}
			return "", errdefs.InvalidArgument("file: the qcow2 names a backing file (%q), a path on the node: flatten it first (qemu-img convert -O qcow2)", name)
		}
		if version >= 3 && binary.BigEndian.Uint64(head[qcow2IncompatOffset:])&qcow2ExternalData != 0 {
			return "", errdefs.InvalidArgument("file: the qcow2 keeps its data in an external data file, a path on the node: convert it first (qemu-img convert -O qcow2)")
		}
		return "qcow2", nil
	case bytes.HasPrefix(head, []byte(qcow2Magic)):
		return "", errdefs.InvalidArgument("file: a truncated qcow2 header: not a disk image")
	}
	for magic, format := range map[string]string{"KDMV": "vmdk", "# Disk DescriptorFile": "vmdk", "vhdxfile": "vhdx",
		"conectix": "vpc", "<<< ": "vdi"} {
		if bytes.HasPrefix(head, []byte(magic)) {
			return "", errdefs.InvalidArgument("file: a %s disk; import takes qcow2 or raw (qemu-img convert -O qcow2 first)", format)
		}
	}
	return "raw", nil
}

// Import stores a qcow2 or raw disk read from r as ref. The disk is
// checked before it is kept: qemu-img must see qcow2 or raw, a qcow2 may
// not name a backing or data file (a path on the node), and a raw disk
// must carry a partition table (an MBR signature; GPT disks have a
// protective MBR), which a stray file does not.
func (s *Images) Import(ctx context.Context, ref, firmware string, r io.Reader) (Image, error) {
	if err := checkRef(ref); err != nil {
		return Image{}, err
	}
	if firmware != FirmwareBIOS && firmware != FirmwareUEFI {
		return Image{}, errdefs.InvalidArgument("firmware: %q must be bios or uefi", firmware)
	}
	if _, err := s.load(ref); err == nil {
		return Image{}, errdefs.AlreadyExists("vm image %s: exists (vm-image rm it first, or pick another version)", ref)
	}
	tmp, err := s.tempDir()
	if err != nil {
		return Image{}, fmt.Errorf("vm image %s: %w", ref, err)
	}
	defer os.RemoveAll(tmp)
	f, err := os.OpenFile(filepath.Join(tmp, "disk"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Image{}, err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Image{}, fmt.Errorf("vm image %s: receive: %w", ref, err)
	}
	if n == 0 {
		return Image{}, errdefs.InvalidArgument("file: empty: not a disk image")
	}
	format, err := sniffFormat(filepath.Join(tmp, "disk"))
	if err != nil {
		return Image{}, fmt.Errorf("vm image %s: %w", ref, err)
	}
	// The format is given, so qemu-img probes nothing.
	di, err := qemuImgInfo(ctx, filepath.Join(tmp, "disk"), format)
	if err != nil {
		return Image{}, fmt.Errorf("vm image %s: %w", ref, err)
	}
	switch di.Format {
	case "qcow2":
		// sniffFormat refused these already; qemu-img's reading agrees.
		if di.BackingFilename != "" || di.FormatSpecific.Data.DataFile != "" {
			return Image{}, errdefs.InvalidArgument("file: the qcow2 names a backing or data file (%q): flatten it first (qemu-img convert -O qcow2)", di.BackingFilename+di.FormatSpecific.Data.DataFile)
		}
	case "raw":
		if err := checkPartitioned(filepath.Join(tmp, "disk")); err != nil {
			return Image{}, fmt.Errorf("vm image %s: %w", ref, err)
		}
	default:
		return Image{}, errdefs.InvalidArgument("file: qemu-img sees format %q; import takes qcow2 or raw (qemu-img convert -O qcow2 first)", di.Format)
	}
	disk := "disk." + di.Format
	if err := os.Rename(filepath.Join(tmp, "disk"), filepath.Join(tmp, disk)); err != nil {
		return Image{}, err
	}
	return s.install(tmp, Image{Ref: ref, Format: di.Format, Firmware: firmware, Disk: disk,
		VirtualSize: di.VirtualSize, FileSize: n, Source: "import", Created: time.Now().UTC()})
}

// checkPartitioned accepts a raw disk with an MBR boot signature.
func checkPartitioned(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var sector [512]byte
	if _, err := io.ReadFull(f, sector[:]); err != nil {
		return errdefs.InvalidArgument("file: shorter than one sector: not a disk image")
	}
	if binary.LittleEndian.Uint16(sector[510:]) != 0xaa55 {
		return errdefs.InvalidArgument("file: not a disk image: no partition table (no MBR signature at byte 510; import takes qcow2 or a raw disk with an MBR or GPT)")
	}
	return nil
}
