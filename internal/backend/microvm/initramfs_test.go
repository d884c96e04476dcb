package microvm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// TestInitramfs: modules come with their dependencies first, the archive
// is what the kernel unpacks (checked with cpio(1)), and a sandbox's initrd
// appends its config to the shared base.
func TestInitramfs(t *testing.T) {
	dir := t.TempDir()
	mods := filepath.Join(dir, "modules")
	if err := os.MkdirAll(filepath.Join(mods, "kernel/fs"), 0o755); err != nil {
		t.Fatal(err)
	}
	dep := "kernel/fs/ext4.ko: kernel/lib/crc16.ko kernel/fs/jbd2.ko kernel/fs/mbcache.ko\nkernel/fs/jbd2.ko:\nkernel/lib/crc16.ko:\nkernel/fs/mbcache.ko:\nkernel/fs/unused.ko:\n"
	if err := os.WriteFile(filepath.Join(mods, "modules.dep"), []byte(dep), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := resolveModules(mods, []string{"ext4", "builtin_one"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "kernel/fs/mbcache.ko kernel/fs/jbd2.ko kernel/lib/crc16.ko kernel/fs/ext4.ko"; strings.Join(got, " ") != want {
		t.Errorf("load order %v, want %s", got, want)
	}
	for _, m := range got {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(mods, m)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mods, m), []byte("module "+m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	agent := filepath.Join(dir, "agent")
	bb := filepath.Join(dir, "busybox")
	os.WriteFile(agent, []byte("agent"), 0o755)
	os.WriteFile(bb, []byte("busybox"), 0o755)
	ir, err := buildInitramfs(dir, agent, bb, mods, []string{"ext4"})
	if err != nil {
		t.Fatal(err)
	}
	if again, err := buildInitramfs(dir, agent, bb, mods, []string{"ext4"}); err != nil || again.path != ir.path {
		t.Errorf("second build: %v %v, want the cached %s", again, err, ir.path)
	}
	initrd := filepath.Join(dir, "initrd")
	if err := ir.writeInitrd(initrd, agentproto.FileConfig{Secret: "s3cret"}); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("cpio(1) not installed")
	}
	out, err := exec.Command("cpio", "-it", "--quiet", "-F", ir.path).CombinedOutput()
	if err != nil {
		t.Fatalf("cpio: %v %s", err, out)
	}
	for _, want := range []string{"init", "corral/busybox", "dev/console", "corral/modules/ext4.ko", "corral/modules/crc16.ko"} {
		if !strings.Contains("\n"+string(out), "\n"+want+"\n") {
			t.Errorf("base archive lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "config.json") {
		t.Error("the shared base archive holds a sandbox config")
	}
	// The per-sandbox file: the base, then a second archive with the config.
	base, _ := os.ReadFile(ir.path)
	whole, _ := os.ReadFile(initrd)
	if !strings.HasPrefix(string(whole), string(base)) || !strings.Contains(string(whole[len(base):]), `"secret":"s3cret"`) {
		t.Error("initrd is not the base followed by the config archive")
	}
	if st, _ := os.Stat(initrd); st.Mode().Perm() != 0o600 {
		t.Errorf("initrd mode %v, want 0600 (it holds the secret)", st.Mode().Perm())
	}
}
