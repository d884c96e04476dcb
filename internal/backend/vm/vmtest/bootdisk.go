// Package vmtest builds VM disks that carry their own boot loader, the
// kind of image users bring to `corral vm-image import`, for the tests of
// the bios and uefi firmware paths: from the Debian image that
// `vm-image build debian` makes (its ext4 root file system, kernel and
// initrd), a partitioned disk that SeaBIOS boots through syslinux (MBR,
// FAT boot partition) or OVMF through systemd-boot (GPT, EFI system
// partition). Everything is made on files with Debian's tools (sfdisk,
// mkfs.vfat, mtools, syslinux, debugfs): nothing is mounted.
//
// It owns only disk building; it imports nothing of corral (in particular
// not the vm backend, whose image store the disks are imported into
// through the API like any user's).
package vmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// Recipe versions what BootDisk builds; a change bumps it, so cached
// disks of an earlier recipe are not reused.
const Recipe = "bootdisk-2"

// Firmware values, as `vm-image import --firmware` takes them.
const (
	BIOS = "bios"
	UEFI = "uefi"
)

// Files the builders take from Debian packages.
var (
	syslinuxMBR  = "/usr/lib/syslinux/mbr/mbr.bin"                 // syslinux-common
	systemdBoot  = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi" // systemd-boot-efi
	ovmfCodeFile = "/usr/share/OVMF/OVMF_CODE_4M.fd"               // ovmf
	// As the built image's (quiet: every console line is emulated I/O
	// under TCG), with tsc=reliable for the TSC rate the direct boot
	// passes and a boot loader's fixed configuration cannot: a loaded TCG
	// host otherwise makes the guest distrust its TSC and read the HPET.
	bootCmdline = "root=/dev/vda2 rw console=ttyS0 console=tty0 quiet loglevel=3 panic=-1 systemd.show_status=0 tsc=reliable"
)

// Missing says which Debian package the host lacks to build (and boot) a
// disk for firmware, nil when it has them all.
func Missing(firmware string) error {
	tools := map[string]string{"qemu-img": "qemu-utils", "sfdisk": "fdisk", "mkfs.vfat": "dosfstools",
		"mcopy": "mtools", "debugfs": "e2fsprogs", "resize2fs": "e2fsprogs", "e2fsck": "e2fsprogs"}
	files := map[string]string{}
	switch firmware {
	case BIOS:
		tools["syslinux"] = "syslinux"
		files[syslinuxMBR] = "syslinux-common"
	case UEFI:
		files[systemdBoot] = "systemd-boot-efi"
		files[ovmfCodeFile] = "ovmf"
	default:
		return fmt.Errorf("firmware: %q must be bios or uefi", firmware)
	}
	for tool, pkg := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("needs %s (apt-get install %s)", tool, pkg)
		}
	}
	for f, pkg := range files {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("needs %s (apt-get install %s)", f, pkg)
		}
	}
	return nil
}

// BootDisk returns a disk for firmware built from the Debian image
// directory src (disk.qcow2, vmlinuz, initrd.img), cached under
// cacheRoot keyed by Recipe, the firmware and src's directory name (which
// the Debian image's own cache keys by its recipe and agent). BIOS disks
// are raw (as a dd-able download), UEFI disks compressed qcow2, so an
// import test covers both formats.
func BootDisk(ctx context.Context, src, cacheRoot, firmware string) (string, error) {
	if err := Missing(firmware); err != nil {
		return "", err
	}
	name := "disk.raw"
	if firmware == UEFI {
		name = "disk.qcow2"
	}
	dir := filepath.Join(cacheRoot, Recipe+"-"+firmware+"-"+filepath.Base(src))
	out := filepath.Join(dir, name)
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(cacheRoot, 0o700); err != nil {
		return "", err
	}
	work, err := os.MkdirTemp(cacheRoot, ".tmp-bootdisk-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	w := &builder{ctx: ctx, src: src, work: work}
	var disk string
	if firmware == BIOS {
		disk, err = w.bios()
	} else {
		disk, err = w.uefi()
	}
	if err != nil {
		return "", fmt.Errorf("build %s boot disk: %w", firmware, err)
	}
	if err := os.Mkdir(filepath.Join(work, "out"), 0o700); err != nil {
		return "", err
	}
	if err := os.Rename(disk, filepath.Join(work, "out", name)); err != nil {
		return "", err
	}
	// A concurrent build may have won: either result is the same disk.
	if err := os.Rename(filepath.Join(work, "out"), dir); err != nil {
		if _, serr := os.Stat(out); serr == nil {
			return out, nil
		}
		return "", err
	}
	// Disks of this firmware from older sources or recipes are not used
	// again (the newest Debian image is the source): hundreds of MiB each.
	old, _ := filepath.Glob(filepath.Join(cacheRoot, "bootdisk-*-"+firmware+"-*"))
	for _, o := range old {
		if o != dir {
			_ = os.RemoveAll(o)
		}
	}
	return out, nil
}

type builder struct {
	ctx       context.Context
	src, work string
}

func (b *builder) path(name string) string { return filepath.Join(b.work, name) }

func (b *builder) run(name string, args ...string) error {
	var outb bytes.Buffer
	cmd := exec.CommandContext(b.ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &outb, &outb
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(outb.String()))
	}
	return nil
}

const (
	mib     = 1 << 20
	bootMiB = 64 // the FAT partition: kernel, initrd, boot loader
)

// rootFS unpacks the Debian image's ext4 root, shrinks it to its files
// plus room to write, and adapts it to a partitioned disk: fstab by
// label, and no growth to the whole disk (the Debian image's service for
// that resizes /dev/vda, which is now the partition table).
func (b *builder) rootFS() (string, int64, error) {
	root := b.path("root.ext4")
	if err := b.run("qemu-img", "convert", "-O", "raw", filepath.Join(b.src, "disk.qcow2"), root); err != nil {
		return "", 0, err
	}
	if err := b.run("e2fsck", "-fy", root); err != nil {
		var ee *exec.ExitError
		// Exit 1: errors corrected (the journal replayed); anything above is not.
		if !errors.As(err, &ee) || ee.ExitCode() > 1 {
			return "", 0, err
		}
	}
	if err := b.run("resize2fs", "-M", root); err != nil {
		return "", 0, err
	}
	fi, err := os.Stat(root)
	if err != nil {
		return "", 0, err
	}
	size := (fi.Size() + 128*mib + mib - 1) &^ (mib - 1)
	if err := os.Truncate(root, size); err != nil {
		return "", 0, err
	}
	if err := b.run("resize2fs", root); err != nil {
		return "", 0, err
	}
	fstab := b.path("fstab")
	if err := os.WriteFile(fstab, []byte("LABEL=corral-root / ext4 defaults,discard,errors=remount-ro 0 1\n"), 0o644); err != nil {
		return "", 0, err
	}
	for _, req := range []string{"rm /etc/fstab", "write " + fstab + " /etc/fstab",
		"rm /etc/systemd/system/multi-user.target.wants/corral-growfs.service"} {
		if err := b.run("debugfs", "-w", "-R", req, root); err != nil {
			return "", 0, err
		}
	}
	return root, size, nil
}

// fat makes the FAT file system of the boot partition holding the
// kernel, the initrd and files (FAT path → local path).
func (b *builder) fat(name string, dirs []string, files map[string]string) (string, error) {
	img := b.path(name)
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return "", err
	}
	if err := os.Truncate(img, bootMiB*mib); err != nil {
		return "", err
	}
	if err := b.run("mkfs.vfat", "-F", "32", "-n", "CORRALBOOT", img); err != nil {
		return "", err
	}
	for _, d := range dirs {
		if err := b.run("mmd", "-i", img, "::"+d); err != nil {
			return "", err
		}
	}
	files["/vmlinuz"] = filepath.Join(b.src, "vmlinuz")
	files["/initrd.img"] = filepath.Join(b.src, "initrd.img")
	for dst, src := range files {
		if err := b.run("mcopy", "-i", img, src, "::"+dst); err != nil {
			return "", err
		}
	}
	return img, nil
}

// configs writes boot loader configuration files (name → content) into
// the work dir and returns them as FAT path → local path, under fatDir.
func (b *builder) configs(fatDir string, files map[string]string) (map[string]string, error) {
	out := map[string]string{}
	for name, content := range files {
		p := b.path(filepath.Base(name))
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return nil, err
		}
		out[fatDir+name] = p
	}
	return out, nil
}

// assemble makes a disk with a partition table (sfdisk script) and the
// boot and root partitions at 1 MiB and 1 MiB + bootMiB.
func (b *builder) assemble(table, boot, root string, rootSize int64) (string, error) {
	disk := b.path("disk.raw")
	if err := os.WriteFile(disk, nil, 0o600); err != nil {
		return "", err
	}
	// 1 MiB before the partitions; 1 MiB after for GPT's backup header.
	if err := os.Truncate(disk, (1+bootMiB+1)*mib+rootSize); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(b.ctx, "sfdisk", "-q", disk)
	cmd.Stdin = strings.NewReader(table)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("sfdisk: %v: %s", err, strings.TrimSpace(string(out)))
	}
	for _, p := range []struct {
		file  string
		seek  int
		extra string
	}{{boot, 1, ""}, {root, 1 + bootMiB, ",sparse"}} {
		if err := b.run("dd", "if="+p.file, "of="+disk, "bs=1M", "seek="+strconv.Itoa(p.seek), "conv=notrunc"+p.extra, "status=none"); err != nil {
			return "", err
		}
	}
	return disk, nil
}

// bios: an MBR with syslinux's boot code, a bootable FAT partition with
// syslinux (ldlinux.sys) and its configuration, and the root partition.
func (b *builder) bios() (string, error) {
	root, size, err := b.rootFS()
	if err != nil {
		return "", err
	}
	files, err := b.configs("", map[string]string{
		"/syslinux.cfg": "DEFAULT linux\nPROMPT 0\nTIMEOUT 0\nLABEL linux\n  KERNEL /vmlinuz\n  INITRD /initrd.img\n  APPEND " + bootCmdline + "\n"})
	if err != nil {
		return "", err
	}
	boot, err := b.fat("boot.fat", nil, files)
	if err != nil {
		return "", err
	}
	if err := b.run("syslinux", "--install", boot); err != nil {
		return "", err
	}
	table := fmt.Sprintf("label: dos\nstart=2048, size=%d, type=c, bootable\nstart=%d, type=83\n", bootMiB*mib/512, 2048+bootMiB*mib/512)
	disk, err := b.assemble(table, boot, root, size)
	if err != nil {
		return "", err
	}
	// The MBR's boot code (440 bytes, before the partition table).
	if err := b.run("dd", "if="+syslinuxMBR, "of="+disk, "bs=440", "count=1", "conv=notrunc", "status=none"); err != nil {
		return "", err
	}
	return disk, nil
}

// uefi: GPT with an EFI system partition holding systemd-boot at the
// removable-media path OVMF boots without boot entries
// (\EFI\BOOT\BOOTX64.EFI) and one loader entry, and the root partition;
// converted to compressed qcow2.
func (b *builder) uefi() (string, error) {
	root, size, err := b.rootFS()
	if err != nil {
		return "", err
	}
	files, err := b.configs("/loader", map[string]string{
		"/loader.conf":         "default corral.conf\ntimeout 0\n",
		"/entries/corral.conf": "title Debian (corral uefi test)\nlinux /vmlinuz\ninitrd /initrd.img\noptions " + bootCmdline + "\n"})
	if err != nil {
		return "", err
	}
	files["/EFI/BOOT/BOOTX64.EFI"] = systemdBoot
	esp, err := b.fat("esp.fat", []string{"/EFI", "/EFI/BOOT", "/loader", "/loader/entries"}, files)
	if err != nil {
		return "", err
	}
	table := fmt.Sprintf("label: gpt\nstart=2048, size=%d, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, name=\"EFI system\"\nstart=%d, size=%d, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name=root\n",
		bootMiB*mib/512, 2048+bootMiB*mib/512, size/512)
	raw, err := b.assemble(table, esp, root, size)
	if err != nil {
		return "", err
	}
	_ = os.Remove(root)
	q := b.path("disk.qcow2")
	if err := b.run("qemu-img", "convert", "-c", "-O", "qcow2", raw, q); err != nil {
		return "", err
	}
	return q, nil
}
