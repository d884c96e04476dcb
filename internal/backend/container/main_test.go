package container

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/backend/backendtest"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/storage/upper"
	"github.com/corral-dev/corral/internal/storage/upper/ext4img"
)

var (
	initPath string // corral-init built for the tests
	layerDir string // busybox rootfs, the one read-only layer
	tmpRoot  string
	cgParent string
	// needRoot, when set, is why every test that makes a sandbox skips.
	needRoot string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		needRoot = "container backend: needs root (namespaces, cgroups, mounts)"
		return m.Run()
	}
	var err error
	tmpRoot, err = os.MkdirTemp("", "corral-container-test-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(tmpRoot)
	initPath = filepath.Join(tmpRoot, "corral-init")
	build := exec.Command("go", "build", "-o", initPath, "github.com/corral-dev/corral/cmd/corral-init")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Printf("build corral-init: %v\n%s", err, out)
		return 1
	}
	// Beside corral-init, where the backend looks for it (testenv's
	// BuildInitStub would be an import cycle through the server).
	stub := exec.Command("gcc", "-static", "-Os", "-s", "-Wall", "-Wl,-e,stub_entry", "-o", filepath.Join(tmpRoot, "corral-initstub"), "../../guest/init/stub/stub.c")
	if out, err := stub.CombinedOutput(); err != nil {
		fmt.Printf("build corral-initstub: %v\n%s", err, out)
		return 1
	}
	layerDir = filepath.Join(tmpRoot, "layer")
	if err := makeBusyboxRoot(layerDir); err != nil {
		fmt.Println("busybox rootfs:", err)
		return 1
	}
	// busybox has no ipcmk/ipcs: a static helper makes and counts SysV IPC.
	ipctool := exec.Command("go", "build", "-o", filepath.Join(layerDir, "bin", "ipctool"), "./testdata/ipctool")
	ipctool.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := ipctool.CombinedOutput(); err != nil {
		fmt.Printf("build ipctool: %v\n%s", err, out)
		return 1
	}
	b := make([]byte, 4)
	rand.Read(b)
	cgParent = "corral-test-" + hex.EncodeToString(b)
	code := m.Run()
	if mgr, err := cgroup.NewManager(cgParent); err == nil {
		if err := errors.Join(mgr.RemoveParent(), mgr.Idle().RemoveParent()); err != nil {
			fmt.Println("remove test cgroup parent:", err)
			code = 1
		}
	}
	return code
}

// makeBusyboxRoot builds a tiny root filesystem from the host's static
// busybox, with a root and an unprivileged user.
func makeBusyboxRoot(dir string) error {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox-static not installed: %w", err)
	}
	for _, d := range []string{"bin", "etc", "tmp", "proc", "dev", "sys", "root", "home/agent"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	os.Chmod(filepath.Join(dir, "tmp"), 0o1777)
	os.Chown(filepath.Join(dir, "home/agent"), 1000, 1000)
	data, err := os.ReadFile(bb)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), data, 0o755); err != nil {
		return err
	}
	list, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return err
	}
	for _, name := range strings.Fields(string(list)) {
		if name == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", name)); err != nil {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":    "root:x:0:\nagent:x:1000:\nextra:x:2000:agent\nnogroup:x:65534:\n",
		"etc/original": "original\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

var idSeq struct {
	sync.Mutex
	n int
}

func newID(t testing.TB) string {
	idSeq.Lock()
	defer idSeq.Unlock()
	idSeq.n++
	return fmt.Sprintf("t%d-%d", idSeq.n, time.Now().UnixNano()%100000)
}

func newBackend(t testing.TB) *Backend {
	t.Helper()
	skipUnlessRoot(t)
	b, err := New(Config{
		RunDir:       filepath.Join(tmpRoot, "run"),
		CgroupParent: cgParent,
		InitPath:     initPath,
		Uppers:       upper.DirStore{Root: filepath.Join(tmpRoot, "upper")},
		// The directory-store backend runs the stub, the disk one
		// (newDiskBackend) corral-init as PID 1: the suite covers both.
		Stub: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

var diskStore struct {
	sync.Once
	s   *ext4img.Store
	err error
}

// newDiskBackend is newBackend with the ext4-image disk store (one store
// for the whole run, under tmpRoot/disk).
func newDiskBackend(t testing.TB) *Backend {
	t.Helper()
	skipUnlessRoot(t)
	diskStore.Do(func() {
		diskStore.s, diskStore.err = ext4img.Open(context.Background(), ext4img.Config{Dir: diskDir()})
	})
	if errdefs.IsNotSupported(diskStore.err) {
		t.Skipf("skip: %v", diskStore.err)
	}
	if diskStore.err != nil {
		t.Fatal(diskStore.err)
	}
	b, err := New(Config{
		RunDir:       filepath.Join(tmpRoot, "run"),
		CgroupParent: cgParent,
		InitPath:     initPath,
		Uppers:       diskStore.s,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func skipUnlessRoot(t testing.TB) {
	t.Helper()
	if needRoot != "" {
		t.Skip(needRoot)
	}
}

func diskDir() string { return filepath.Join(tmpRoot, "disk") }

// withDisk sets a disk limit (required by the ext4-image store).
func withDisk(bytes, inodes int64) func(*backend.Spec) {
	return func(sp *backend.Spec) { sp.Resources.DiskBytes, sp.Resources.DiskInodes = bytes, inodes }
}

func defaultSpec(id string) backend.Spec {
	return backend.Spec{
		ID:        id,
		Layers:    []string{layerDir},
		Hostname:  "sbx",
		Resources: backend.Resources{CPUMillis: 1000, MemoryBytes: 256 << 20, Pids: 256},
	}
}

// newSandbox creates a sandbox that is cleaned up (and checked) at the end
// of the test.
func newSandbox(t testing.TB, b *Backend, mod func(*backend.Spec)) backend.Sandbox {
	t.Helper()
	spec := defaultSpec(newID(t))
	if mod != nil {
		mod(&spec)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("CORRAL_TEST_DEBUG") != "" {
			log, _ := os.ReadFile(filepath.Join(b.runDir(s.ID()), "init.log"))
			t.Logf("init.log of %s:\n%s", s.ID(), log)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.Cleanup(ctx, s.ID(), s.Record()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return s
}

// createBare creates a sandbox whose removal is the test's own business.
func createBare(t testing.TB, b *Backend, spec backend.Spec) backend.Sandbox {
	t.Helper()
	s, err := b.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// result of one command run through Exec.
type result struct {
	backend.ExecResult
	stdout, stderr string
}

func run1(t testing.TB, s backend.Sandbox, spec backend.ExecSpec) result {
	t.Helper()
	r, err := tryRun(context.Background(), s, spec)
	if err != nil {
		t.Fatalf("exec %q: %v", spec.Argv, err)
	}
	return r
}

func tryRun(ctx context.Context, s backend.Sandbox, spec backend.ExecSpec) (result, error) {
	if spec.Env == nil {
		spec.Env = []string{"PATH=/bin", "HOME=/root"}
	}
	r, err := backendtest.Exec(ctx, s, spec)
	return result{r.ExecResult, r.Stdout, r.Stderr}, err
}

func sh(t testing.TB, s backend.Sandbox, script string) result {
	t.Helper()
	return run1(t, s, backend.ExecSpec{Argv: []string{"sh", "-c", script}})
}
