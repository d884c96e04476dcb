package microvm

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

// TestSweepFindsVMMWithoutState: a VMM process whose run dir holds no state
// file (a crash mid-create) is still found by its command line and killed.
func TestSweepFindsVMMWithoutState(t *testing.T) {
	b := newBackend(t)
	dir := b.runDir("orphan-1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A QEMU that only waits (-S: no guest started), named like ours.
	cmd := exec.Command(b.drv.(*qemu).bin, "-M", "microvm", "-S", "-nodefaults", "-display", "none",
		"-qmp", "unix:"+dir+"/qmp.sock,server=on,wait=off")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for len(b.vms.Processes()["orphan-1"]) == 0 {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the orphan VMM is not found by its command line")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := b.Sweep(context.Background(), func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "killed") {
			t.Errorf("orphan VMM ended with %v, want killed", err)
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("orphan VMM survived Sweep")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("orphan run dir left: %v", err)
	}
}

// TestFirecracker runs the exec round trip on Firecracker where it can run.
func TestFirecracker(t *testing.T) {
	fc, err := exec.LookPath("firecracker")
	if err != nil {
		t.Skip("firecracker: no firecracker binary in PATH")
	}
	if !KVMAvailable() {
		t.Skip("firecracker: needs KVM (/dev/kvm with vmx/svm), which this host lacks")
	}
	b := newBackend(t, func(c *Config) { c.Firecracker = fc })
	if b.Driver() != "firecracker" {
		t.Fatalf("driver %s, want firecracker", b.Driver())
	}
	sb := create(t, b, testSpec(t))
	if got := sh(t, sb, "echo fc"); got != "fc\n" {
		t.Errorf("firecracker exec: %q", got)
	}
	var _ backend.Sandbox = sb
}
