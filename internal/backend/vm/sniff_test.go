package vm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

// TestSniffFormat: an uploaded disk's format comes from its header, and
// what would make a qemu tool open a node path (a qcow2's backing or
// external data file, a VMDK's extents) is refused before any tool runs.
func TestSniffFormat(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("needs qemu-img (package qemu-utils)")
	}
	dir := t.TempDir()
	qcow := func(name string, opts ...string) string {
		p := filepath.Join(dir, name)
		args := append(append([]string{"create", "-q", "-f", "qcow2"}, opts...), p, "16M")
		if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v %s", args, err, out)
		}
		return p
	}
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		what, path, format, refusal string
	}{
		{"a qcow2", qcow("plain.qcow2"), "qcow2", ""},
		{"a qcow2 v2", qcow("v2.qcow2", "-o", "compat=0.10"), "qcow2", ""},
		{"a qcow2 with a backing file", qcow("backed.qcow2", "-u", "-b", "/etc/shadow", "-F", "raw"), "", `backing file ("/etc/shadow")`},
		{"a qcow2 with a data file", qcow("data.qcow2", "-o", "data_file="+filepath.Join(dir, "d.bin")), "", "external data file"},
		{"a truncated qcow2", file("short.qcow2", "QFI\xfb\x00\x00\x00\x03"), "", "truncated"},
		{"a vmdk descriptor", file("d.vmdk", "# Disk DescriptorFile\nRW 8 FLAT \"/etc/shadow\" 0\n"), "", "vmdk"},
		{"a vhdx", file("d.vhdx", "vhdxfile"+strings.Repeat("\x00", 100)), "", "vhdx"},
		{"anything else", file("text", "hello"), "raw", ""},
	} {
		got, err := sniffFormat(tc.path)
		switch {
		case tc.refusal == "" && (err != nil || got != tc.format):
			t.Errorf("%s: %q, %v; want %s", tc.what, got, err, tc.format)
		case tc.refusal != "" && (!errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.refusal) || !strings.HasPrefix(err.Error(), "file: ")):
			t.Errorf("%s: %q, %v; want invalid_argument naming file: and %q", tc.what, got, err, tc.refusal)
		}
	}
}
