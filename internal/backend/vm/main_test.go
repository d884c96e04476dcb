package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/netpolicy/netlab"
)

// The tests boot real guests (under TCG here: slow), so they share one
// booted, networked VM (shared; a second one without network, plain, boots
// beside it for the snapshot test) and build the Debian image once into a
// cache that later runs reuse (keyed by DebianRecipe).

var (
	tmpRoot string
	// cacheDir is keyed by the recipe and the agent built into it (Go
	// builds are reproducible: an unchanged agent reuses the image).
	cacheDir  string
	agentPath string
	buildErr  error
	testRef   = "debian@test"
)

func TestMain(m *testing.M) { os.Exit(setup(m)) }

func setup(m *testing.M) int {
	if os.Geteuid() != 0 {
		// The tests that boot a guest skip, naming this; the others run.
		buildErr = errors.New("the vm tests need root (mmdebstrap, tap devices)")
		return m.Run()
	}
	var err error
	tmpRoot, err = os.MkdirTemp("", "corral-vm-test-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(tmpRoot)
	agentPath = filepath.Join(tmpRoot, "corral-agent")
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", agentPath, "github.com/corral-dev/corral/cmd/corral-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Printf("build corral-agent: %v\n%s", err, out)
		return 1
	}
	bin, err := os.ReadFile(agentPath)
	if err != nil {
		panic(err)
	}
	// The unit and rule are keyed too: DebianRecipe changes only on merge.
	sum := sha256.Sum256(append(bin, agentUnit+agentUdevRule...))
	cacheDir = filepath.Join(os.TempDir(), "corral-vm-image-cache", DebianRecipe+"-"+hex.EncodeToString(sum[:6]))
	if _, err := os.Stat(filepath.Join(cacheDir, "disk.qcow2")); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		start := time.Now()
		_ = os.MkdirAll(filepath.Dir(cacheDir), 0o700)
		_, buildErr = BuildDebian(ctx, cacheDir, agentPath, func(s string) { fmt.Println("vm-image build:", s) })
		cancel()
		fmt.Printf("vm-image build debian: %v (err %v)\n", time.Since(start).Round(time.Second), buildErr)
	}
	code := m.Run()
	stopShared()
	return code
}

// newBackend returns a backend with its own dirs and the cached image
// adopted as testRef, or skips when the host lacks QEMU or the image.
// cgroupParent[0], when given, is Config.CgroupParent.
func newBackend(t *testing.T, cgroupParent ...string) *Backend {
	t.Helper()
	if buildErr != nil {
		t.Skipf("no Debian VM image: %v", buildErr)
	}
	dir := t.TempDir()
	cfg := Config{RunDir: filepath.Join(dir, "run"), ImageDir: filepath.Join(dir, "images")}
	if len(cgroupParent) > 0 {
		cfg.CgroupParent = cgroupParent[0]
	}
	b, err := New(cfg)
	if errdefs.IsNotSupported(err) {
		t.Skipf("vm backend unavailable: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.images.Adopt(cacheDir, testRef); err != nil {
		t.Fatal(err)
	}
	return b
}

var specSeq int

func testSpec() backend.Spec {
	specSeq++
	return backend.Spec{
		ID:        fmt.Sprintf("t%d-%d", time.Now().UnixNano()%1e6, specSeq),
		Image:     testRef,
		Hostname:  "sandbox",
		Resources: backend.Resources{CPUMillis: 1000, MemoryBytes: 512 << 20, DiskBytes: 2 << 30},
	}
}

// sharedBootTimeout bounds the boots of the shared and plain VMs, which
// boot side by side under TCG on a host that other tests load too (5 min,
// the backend's TCG default, was seen to run out at a load of 30 on 2 CPUs).
const sharedBootTimeout = 9 * time.Minute

// shared is the one booted VM the tests share, made on first use. It is
// networked (allowlist: pypi) on a lab internet.
var shared struct {
	once   sync.Once
	dir    string
	b      *Backend
	sb     *sandbox
	spec   backend.Spec
	boot   time.Duration
	err    error
	lab    *netlab.Lab
	netCfg netpolicy.Config
	net    *netpolicy.Manager
}

// sharedNetwork makes the lab internet and a network manager on it.
func sharedNetwork() error {
	lab, err := netlab.New()
	if err != nil {
		return fmt.Errorf("lab network: %w", err)
	}
	shared.lab = lab
	shared.netCfg = netpolicy.Config{
		Bridge:    fmt.Sprintf("cw%x", time.Now().UnixNano()&0xffffffff),
		NodeNetns: lab.NodePath,
		Upstreams: []string{netip.AddrPortFrom(netlab.DNS4, 53).String()},
		Presets:   map[string][]string{"pypi": {"pypi.test:80"}},
		PoolSize:  1,
	}
	shared.net, err = netpolicy.NewManager(shared.netCfg)
	return err
}

func sharedVM(t *testing.T) (*Backend, *sandbox) {
	t.Helper()
	if buildErr != nil {
		t.Skipf("no Debian VM image: %v", buildErr)
	}
	shared.once.Do(func() {
		dir, err := os.MkdirTemp(tmpRoot, "shared-")
		if err != nil {
			shared.err = err
			return
		}
		if shared.err = sharedNetwork(); shared.err != nil {
			return
		}
		b, err := New(Config{RunDir: filepath.Join(dir, "run"), ImageDir: filepath.Join(dir, "images"), Network: shared.net,
			CACerts: nodeCA().caPEM, BootTimeout: sharedBootTimeout})
		if err != nil {
			shared.err = err
			return
		}
		if _, err := b.images.Adopt(cacheDir, testRef); err != nil {
			shared.err = err
			return
		}
		shared.dir, shared.b, shared.spec = dir, b, testSpec()
		shared.spec.Network = backend.Network{Mode: "allowlist", Allow: []string{"pypi"}}
		ctx, cancel := context.WithTimeout(context.Background(), sharedBootTimeout+time.Minute)
		defer cancel()
		// The plain VM boots beside it (each TCG vCPU takes one core).
		plain.done = make(chan struct{})
		// Its own context: ctx ends when the shared VM is up, which may
		// be before the plain one is.
		go func() {
			pctx, pcancel := context.WithTimeout(context.Background(), sharedBootTimeout+time.Minute)
			defer pcancel()
			bootPlain(pctx, filepath.Join(dir, "plain"))
		}()
		start := time.Now()
		sb, err := b.Create(ctx, shared.spec)
		shared.boot = time.Since(start)
		if err != nil {
			shared.err = err
			return
		}
		shared.sb = sb.(*sandbox)
	})
	if errdefs.IsNotSupported(shared.err) {
		t.Skipf("vm backend unavailable: %v", shared.err)
	}
	if shared.err != nil {
		t.Fatalf("boot shared vm: %v", shared.err)
	}
	if shared.sb == nil {
		t.Skip("the shared vm was deleted by an earlier test")
	}
	t.Logf("shared vm booted in %v (kvm=%v)", shared.boot.Round(time.Millisecond), shared.b.KVM())
	return shared.b, shared.sb
}

// plain is a second VM without network, snapshotted to disk at pause
// (a networked VM stays in memory), for the snapshot test.
var plain struct {
	done chan struct{} // closed once booted (or failed)
	b    *Backend
	sb   *sandbox
	err  error
}

func bootPlain(ctx context.Context, dir string) {
	defer close(plain.done)
	b, err := New(Config{RunDir: filepath.Join(dir, "run"), ImageDir: filepath.Join(dir, "images"), BootTimeout: sharedBootTimeout})
	if err != nil {
		plain.err = err
		return
	}
	b.cfg.SnapshotAfter = 0
	if _, err := b.images.Adopt(cacheDir, testRef); err != nil {
		plain.err = err
		return
	}
	sb, err := b.Create(ctx, testSpec())
	if err != nil {
		plain.err = err
		return
	}
	plain.b, plain.sb = b, sb.(*sandbox)
}

// plainVM waits for the plain VM (booting beside the shared one).
func plainVM(t *testing.T) (*Backend, *sandbox) {
	t.Helper()
	sharedVM(t)
	<-plain.done
	if plain.err != nil {
		t.Fatalf("boot plain vm: %v", plain.err)
	}
	return plain.b, plain.sb
}

// stopShared deletes the shared VM if a test has not.
func stopShared() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if plain.done != nil {
		<-plain.done
	}
	if plain.sb != nil {
		_ = plain.sb.Stop(ctx)
		_ = plain.b.Cleanup(ctx, plain.sb.m.id, nil)
	}
	if shared.sb != nil {
		_ = shared.sb.Stop(ctx)
		_ = shared.b.Cleanup(ctx, shared.spec.ID, nil)
	}
	if shared.net != nil {
		_ = shared.net.Close()
	}
	if shared.lab != nil {
		shared.lab.Close()
	}
}

// run executes argv and returns the result and output.
func run(t *testing.T, sb backend.Sandbox, spec backend.ExecSpec) (backend.ExecResult, string, string) {
	t.Helper()
	if spec.Timeout == 0 {
		spec.Timeout = 2 * time.Minute
	}
	if spec.Env == nil {
		spec.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	res, err := sb.Exec(ctx, spec, func(s backend.Stream, p []byte) error {
		if s == backend.Stdout {
			out.Write(p)
		} else {
			errb.Write(p)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("exec %q: %v", spec.Argv, err)
	}
	return res, out.String(), errb.String()
}

func sh(t *testing.T, sb backend.Sandbox, script string) string {
	t.Helper()
	res, out, errb := run(t, sb, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", script}, Shell: true})
	if res.ExitCode != 0 {
		t.Fatalf("%q: exit %d, stderr %q", script, res.ExitCode, errb)
	}
	return out
}
