package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/netpolicy/netlab"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// requireMicroVM skips a test when this host cannot boot microVMs (no
// QEMU or no guest kernel).
func requireMicroVM(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/usr/bin/qemu-system-x86_64"); err != nil {
		t.Skip("microvm: needs qemu-system-x86_64 (package qemu-system-x86)")
	}
	if ks, _ := filepath.Glob("/boot/vmlinuz-*"); len(ks) == 0 {
		t.Skip("microvm: needs a guest kernel (package linux-image-amd64)")
	}
}

// startMicroVMServer starts a server with the microvm backend, or skips
// when this host cannot run it (no QEMU or no guest kernel).
func startMicroVMServer(t *testing.T) *testenv.Server {
	t.Helper()
	requireMicroVM(t)
	return testenv.StartServer(t, testenv.WithAgent(t), func(c *server.Config) {
		c.MicroVMSnapshotAfter = 0 // pause = snapshot to disk
	})
}

// TestMicroVMThroughTheAPI: a microvm sandbox is created, used, paused to
// disk, resumed and deleted through the same SDK calls as a container; a
// guest kernel panic and a max lifetime show up as the sandbox's state.
func TestMicroVMThroughTheAPI(t *testing.T) {
	srv := startMicroVMServer(t)
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	vmOpts := func(lifetime time.Duration) client.CreateOptions {
		o := client.CreateOptions{Backend: "microvm", Resources: client.Resources{MemoryBytes: 256 << 20, CPUMillis: 1000}}
		if lifetime > 0 {
			o.MaxLifetime = &lifetime
		}
		return o
	}
	sb := testenv.NewSandbox(t, c, vmOpts(0))
	if info, err := sb.Info(ctx); err != nil || info.Backend != "microvm" || info.State != client.StateRunning {
		t.Fatalf("info = %+v, %v", info, err)
	}
	if got := testenv.Sh(t, sb, "echo $((6*7)) > /root/x; cat /root/x; uname -r"); !strings.HasPrefix(got, "42\n") {
		t.Errorf("sh = %q", got)
	}
	if err := sb.Files().Write(ctx, "/root/from-api", []byte("hello vm")); err != nil {
		t.Fatal(err)
	}
	if got := testenv.Sh(t, sb, "cat /root/from-api"); got != "hello vm" {
		t.Errorf("guest reads %q", got)
	}
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snaps, _ := filepath.Glob(filepath.Join(srv.Config.DataDir, "vm", sb.ID(), "memory.snap"))
	if len(snaps) != 1 {
		t.Errorf("no memory snapshot on disk while paused")
	}
	if got := readEvents(t, c, 0, 1, client.EventOptions{SandboxIDs: []string{sb.ID()}, Types: []string{client.EventCheckpointed}}); got[0].Reason == "" {
		t.Errorf("checkpointed event: %+v", got[0])
	}
	if got := testenv.Sh(t, sb, "cat /root/x"); got != "42\n" { // exec resumes
		t.Errorf("after resume: %q", got)
	}

	crash := testenv.NewSandbox(t, c, vmOpts(0))
	_, _ = crash.Run(ctx, client.Command{Shell: "echo c > /proc/sysrq-trigger", Timeout: time.Minute})
	waitStopped(t, crash, "guest kernel panic")
	if got := testenv.Sh(t, sb, "echo ok"); got != "ok\n" {
		t.Errorf("the other VM after a panic: %q", got)
	}

	short := testenv.NewSandbox(t, c, vmOpts(40*time.Second))
	waitStoppedWithin(t, short, "lifetime", 2*time.Minute)

	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	// Delete answers once the VM is dead; its run dir goes in the
	// background teardown.
	runDir := filepath.Join(srv.Config.DataDir, "vm", sb.ID())
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(runDir); os.IsNotExist(err) {
			break
		} else if time.Now().After(deadline) {
			t.Errorf("run dir left 30s after delete: %v", err)
			break
		}
	}
}

// TestMicroVMNetworkThroughTheAPI: a microVM with an allowlist on the lab
// internet reaches the allowed name, not a denied one; UpdateNetwork and
// NetworkStats work as for containers (refusals counted by the tc program
// on the VM's veth, hook "tap").
func TestMicroVMNetworkThroughTheAPI(t *testing.T) {
	requireMicroVM(t)
	lab := testenv.NetLab(t)
	srv := testenv.StartServer(t, testenv.WithAgent(t), func(c *server.Config) {
		c.Network = testenv.LabNetwork(lab, "cm", labPresets)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: "microvm",
		Resources: client.Resources{MemoryBytes: 256 << 20, CPUMillis: 1000},
		Network:   client.Network{Mode: client.NetworkAllowlist, Allow: []string{"pypi"}}})
	if out := testenv.Sh(t, sb, "nslookup pypi.test >/dev/null && "+httpGet(netlab.PyPI4)); !strings.Contains(out, "lab host "+netlab.PyPI4.String()) {
		t.Errorf("allowed name from the guest: %q", out)
	}
	// A dropped packet: the guest's connect times out (no EPERM in a VM).
	res := testenv.Run(t, sb, client.Command{Shell: "timeout 6 " + httpGet(netlab.NPM4), Timeout: time.Minute})
	if strings.Contains(string(res.Stdout), "lab host") {
		t.Errorf("denied address reached: %q", res.Stdout)
	}
	if _, err := sb.UpdateNetwork(ctx, client.NetworkUpdate{Allow: []string{"npm"}}); err != nil {
		t.Fatal(err)
	}
	if out := testenv.Sh(t, sb, "nslookup npm.test >/dev/null && "+httpGet(netlab.NPM4)); !strings.Contains(out, "lab host "+netlab.NPM4.String()) {
		t.Errorf("newly allowed name from the guest: %q", out)
	}
	st, err := sb.NetworkStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tap := false
	for _, r := range st.Refusals {
		tap = tap || (r.Hook == "tap" && r.Address == netlab.NPM4.String())
	}
	if st.RefusedTotal == 0 || !tap {
		t.Errorf("refusals %d %+v, want the dropped connect counted under hook tap", st.RefusedTotal, st.Refusals)
	}
}
