package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/backend/vm/vmtest"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestVMFirmwareBoots: disks that carry their own boot loader (bios: a
// raw disk with an MBR and syslinux; uefi: a qcow2 GPT disk whose EFI
// system partition holds systemd-boot), built from the Debian VM image
// and cached, are imported through the API (streamed from the client),
// boot under SeaBIOS and OVMF (TCG here), and run `uname -a` through
// qemu-guest-agent, the path of every imported image (they have no
// corral-agent). One boot per firmware; with CORRAL_VM_BOOT_PEER=1 the
// Debian image boots too (direct kernel boot), the peer of the boot→first
// exec times logged at the end (a measurement, so not in every run). Deleting a sandbox leaves no run dir (overlay, UEFI
// variables) behind.
func TestVMFirmwareBoots(t *testing.T) {
	testenv.RequireVMImage(t)
	src := testenv.VMImageDir()
	const peer = "debian@peer"
	srv := testenv.StartServer(t, func(cfg *server.Config) {
		testenv.AdoptVMImage(t, cfg.DataDir, peer)
	})
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	times := map[string]time.Duration{}
	for _, fw := range []string{vmtest.BIOS, vmtest.UEFI} {
		t.Run(fw, func(t *testing.T) {
			if err := vmtest.Missing(fw); err != nil {
				t.Skipf("%s boot disk: %v", fw, err)
			}
			start := time.Now()
			disk, err := vmtest.BootDisk(ctx, src, testenv.VMImageCache(), fw)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s disk %s ready in %v", fw, disk, time.Since(start).Round(time.Millisecond))
			f, err := os.Open(disk)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			start = time.Now()
			im, err := c.ImportVMImage(ctx, f, fw+"@test", fw)
			if err != nil {
				t.Fatalf("import: %v", err)
			}
			t.Logf("imported %s (%s, %d MiB virtual) in %v", im.Ref, im.Format, im.VirtualSize>>20, time.Since(start).Round(time.Millisecond))
			wantFormat := map[string]string{vmtest.BIOS: "raw", vmtest.UEFI: "qcow2"}[fw]
			if im.Firmware != fw || im.Format != wantFormat {
				t.Fatalf("imported %+v, want firmware %s, format %s", im, fw, wantFormat)
			}
			times[fw] = bootUname(ctx, t, c, srv.Config.DataDir, im.Ref, im.VirtualSize)
			if err := c.RemoveVMImage(ctx, im.Ref); err != nil {
				t.Errorf("rm %s after its sandbox: %v", im.Ref, err)
			}
		})
	}
	if os.Getenv("CORRAL_VM_BOOT_PEER") == "1" {
		t.Run("direct", func(t *testing.T) {
			times["direct"] = bootUname(ctx, t, c, srv.Config.DataDir, peer, 0)
		})
	}
	var row []string
	for _, fw := range []string{vmtest.BIOS, vmtest.UEFI, "direct"} {
		if d, ok := times[fw]; ok {
			row = append(row, fmt.Sprintf("%s %v", fw, d.Round(100*time.Millisecond)))
		}
	}
	t.Logf("boot→first exec (TCG, same run): %s", strings.Join(row, ", "))
}

// bootUname creates a vm sandbox from image, runs `uname -a` in it and
// deletes it; it returns the time from Create to the first output.
func bootUname(ctx context.Context, t *testing.T, c *client.Client, dataDir, image string, diskBytes int64) time.Duration {
	t.Helper()
	start := time.Now()
	sb, err := c.Create(ctx, client.CreateOptions{Backend: "vm", Image: image,
		Resources: client.Resources{CPUMillis: 1000, MemoryBytes: 512 << 20, DiskBytes: max(diskBytes, 2<<30)}})
	if err != nil {
		t.Fatalf("create from %s: %v", image, err)
	}
	created := time.Since(start)
	res, err := sb.Run(ctx, client.Command{Args: []string{"uname", "-a"}, Timeout: time.Minute})
	took := time.Since(start)
	if err != nil || res.ExitCode != 0 || !strings.HasPrefix(string(res.Stdout), "Linux ") || !strings.Contains(string(res.Stdout), "x86_64") {
		_ = sb.Delete(ctx)
		t.Fatalf("uname -a in %s: %+v, %v", image, res, err)
	}
	t.Logf("%s: created in %v, first exec answered at %v: %s", image, created.Round(time.Millisecond), took.Round(time.Millisecond), strings.TrimSpace(string(res.Stdout)))
	if err := sb.Delete(ctx); err != nil {
		t.Fatalf("delete: %v", err)
	}
	// The run dir (overlay, OVMF variables, sockets) goes with the sandbox.
	run := filepath.Join(dataDir, "vms", sb.ID())
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(run); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			out, _ := exec.Command("ls", "-la", run).CombinedOutput()
			t.Fatalf("run dir %s still there a minute after delete: %s", run, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return took
}

// TestVMImageImportRefusals: through the API, a file that is not a disk,
// a raw file without a partition table, a qcow2 naming a backing file or
// an external data file, a VMDK naming its extents (all paths on the
// node, which neither the check nor a VM may open) and an unknown or
// missing firmware are each refused with invalid_argument naming the
// field, and leave nothing in the node's image store.
func TestVMImageImportRefusals(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("vm: needs qemu-img (package qemu-utils)")
	}
	srv := testenv.StartServer(t)
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	qcow := func(name string, opts ...string) string {
		p := filepath.Join(dir, name)
		args := append([]string{"create", "-q", "-f", "qcow2"}, opts...)
		if out, err := exec.Command("qemu-img", append(args, p, "16M")...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v %s", args, err, out)
		}
		return p
	}
	text := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("not a disk\n", 500)), 0o600); err != nil {
		t.Fatal(err)
	}
	zeros := filepath.Join(dir, "zeros.raw")
	if err := os.WriteFile(zeros, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	// A VMDK descriptor's extents are paths on the node too.
	vmdk := filepath.Join(dir, "flat.vmdk")
	if err := os.WriteFile(vmdk, []byte("# Disk DescriptorFile\nversion=1\ncreateType=\"monolithicFlat\"\nRW 2048 FLAT \"/etc/shadow\" 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A partitioned raw disk to import with a bad firmware value.
	mbr := make([]byte, 1<<20)
	mbr[510], mbr[511] = 0x55, 0xaa
	good := filepath.Join(dir, "good.raw")
	if err := os.WriteFile(good, mbr, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what, file, firmware string
		want                 []string // in the error message
	}{
		{"a text file", text, "bios", []string{"file:", "not a disk image"}},
		{"a raw file without a partition table", zeros, "bios", []string{"file:", "partition table"}},
		{"a qcow2 with a backing file", qcow("backed.qcow2", "-u", "-b", "/etc/shadow", "-F", "raw"), "uefi", []string{"file:", "backing", "/etc/shadow"}},
		{"a qcow2 with an external data file", qcow("data.qcow2", "-o", "data_file="+filepath.Join(dir, "data.bin")), "uefi", []string{"file:", "data file"}},
		{"a vmdk descriptor", vmdk, "bios", []string{"file:", "vmdk", "qcow2 or raw"}},
		{"firmware coreboot", good, "coreboot", []string{"firmware:", "bios or uefi"}},
		{"no firmware", good, "", []string{"firmware:", "bios or uefi"}},
	} {
		f, err := os.Open(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.ImportVMImage(ctx, f, "bad@1", tc.firmware)
		f.Close()
		if !client.IsInvalidArgument(err) {
			t.Errorf("import of %s: %v, want invalid_argument", tc.what, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("import of %s: %q does not say %q", tc.what, err, w)
			}
		}
	}
	if ims, err := c.ListVMImages(ctx); err != nil || len(ims) != 0 {
		t.Errorf("images after refused imports: %+v, %v", ims, err)
	}
	ents, _ := os.ReadDir(filepath.Join(srv.Config.DataDir, "vm-images"))
	for _, e := range ents {
		t.Errorf("left in the image store after refused imports: %s", e.Name())
	}
	// The partitioned disk itself is fine: the refusal was the firmware's.
	f, err := os.Open(good)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := c.ImportVMImage(ctx, f, "good@1", "bios"); err != nil {
		t.Errorf("import of a partitioned raw disk: %v", err)
	}
}
