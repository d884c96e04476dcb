package microvm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/backend/backendtest"
	"github.com/corral-dev/corral/internal/errdefs"
	image "github.com/corral-dev/corral/internal/storage/layers"
)

// The tests boot real guests (under TCG here: slow), so they keep few VMs
// and generous timeouts.

var (
	tmpRoot   string
	agentPath string
	layers    []string
	disks     []backend.LayerDisk
	// needRoot, when set, is why every test that boots a guest skips.
	needRoot string
)

func TestMain(m *testing.M) { os.Exit(setup(m)) }

func setup(m *testing.M) int {
	if os.Geteuid() != 0 {
		needRoot = "microvm backend: needs root (layer mounts, VMM processes)"
		return m.Run()
	}
	var err error
	tmpRoot, err = os.MkdirTemp("", "corral-microvm-test-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(tmpRoot)
	agentPath = filepath.Join(tmpRoot, "corral-agent")
	build := exec.Command("go", "build", "-o", agentPath, "github.com/corral-dev/corral/cmd/corral-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Printf("build corral-agent: %v\n%s", err, out)
		return 1
	}
	ctx := context.Background()
	store, err := image.Open(ctx, filepath.Join(tmpRoot, "images"))
	if err != nil {
		fmt.Println("image store:", err)
		return 1
	}
	defer store.Close(true)
	img, err := store.Build(ctx, "busybox", nil)
	if err != nil {
		fmt.Println("busybox image:", err)
		return 1
	}
	layers, disks = img.Layers, img.Disks
	return m.Run()
}

// newBackend returns a backend with its own run dir, or skips when the host
// lacks QEMU or a guest kernel.
func newBackend(t *testing.T, mutate ...func(*Config)) *Backend {
	t.Helper()
	skipUnlessRoot(t)
	bb, err := image.StaticBusybox()
	if err != nil {
		t.Skip(err)
	}
	cfg := Config{RunDir: filepath.Join(t.TempDir(), "run"), AgentPath: agentPath, Busybox: bb, SnapshotAfter: -1}
	for _, f := range mutate {
		f(&cfg)
	}
	b, err := New(cfg)
	if errdefs.IsNotSupported(err) {
		t.Skipf("microvm backend unavailable: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func skipUnlessRoot(t *testing.T) {
	t.Helper()
	if needRoot != "" {
		t.Skip(needRoot)
	}
}

var specSeq int

func testSpec(t *testing.T) backend.Spec {
	specSeq++
	return backend.Spec{
		ID:         fmt.Sprintf("t%d-%d", time.Now().UnixNano()%1e6, specSeq),
		Layers:     layers,
		LayerDisks: disks,
		Hostname:   "sandbox",
		Resources: backend.Resources{CPUMillis: 1000, MemoryBytes: 256 << 20, DiskBytes: 64 << 20,
			DiskInodes: 16384, Pids: 256},
	}
}

// create boots a sandbox and registers its deletion.
func create(t *testing.T, b *Backend, spec backend.Spec) backend.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	sb, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Logf("boot %s: %v (kvm=%v)", spec.ID, time.Since(start).Round(time.Millisecond), b.KVM())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := sb.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
		if err := b.Cleanup(ctx, spec.ID, sb.Record()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return sb
}

// sh runs a shell script and returns stdout; a non-zero exit fails the test.
func sh(t *testing.T, sb backend.Sandbox, script string) string {
	t.Helper()
	res, stdout, stderr := run(t, sb, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", script}, Shell: true,
		Env: []string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin"}, Cwd: "/", Timeout: 2 * time.Minute})
	if res.ExitCode != 0 {
		t.Fatalf("%q: exit %d signal %d, stderr %q", script, res.ExitCode, res.Signal, stderr)
	}
	return stdout
}

func run(t *testing.T, sb backend.Sandbox, spec backend.ExecSpec) (backend.ExecResult, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := backendtest.Exec(ctx, sb, spec)
	if err != nil {
		t.Fatalf("exec %q: %v", spec.Argv, err)
	}
	return r.ExecResult, r.Stdout, r.Stderr
}
