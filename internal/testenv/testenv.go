// Package testenv starts real corral servers for tests: it builds the
// binaries once per test process, gives each server its own data dir and
// cgroup parent, and checks on cleanup that nothing (mounts, cgroups,
// processes) was left behind. Only _test files import it.
package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/mountinfo"
	"github.com/corral-dev/corral/internal/procfs"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/server"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// NewSandbox creates a sandbox that is deleted when the test ends.
func NewSandbox(t testing.TB, c *client.Client, o client.CreateOptions) *client.Sandbox {
	t.Helper()
	sb, err := c.Create(context.Background(), o)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = sb.Delete(context.Background()) })
	return sb
}

// CreateRace makes n sandboxes at once, the i-th through create(i), and
// returns those made (deleted when the test ends) and the quota refusals
// (ResourceExhausted); any other error fails the test.
func CreateRace(t testing.TB, n int, create func(i int) (*client.Sandbox, error)) (made []*client.Sandbox, refused []error) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sb, err := create(i)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				made = append(made, sb)
				t.Cleanup(func() { _ = sb.Delete(context.Background()) })
			case client.IsResourceExhausted(err):
				refused = append(refused, err)
			default:
				t.Errorf("create %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	return made, refused
}

// Tree writes files (path → content, parent directories made) into a
// new directory that every user may read, as a layer's root should be,
// and returns it.
func Tree(t testing.TB, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for p, content := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Run runs cmd in sb and fails the test if the call itself fails.
func Run(t testing.TB, sb *client.Sandbox, cmd client.Command) *client.Result {
	t.Helper()
	res, err := sb.Run(context.Background(), cmd)
	if err != nil {
		t.Fatalf("run %v %q: %v", cmd.Args, cmd.Shell, err)
	}
	return res
}

// Sh runs a shell script in sb (for at most two minutes), fails the test
// unless it exits 0, and returns its stdout.
func Sh(t testing.TB, sb *client.Sandbox, script string) string {
	t.Helper()
	res := Run(t, sb, client.Command{Shell: script, Timeout: 2 * time.Minute})
	if res.ExitCode != 0 {
		t.Fatalf("%q exited %d (signal %d): stdout %q stderr %q", script, res.ExitCode, res.Signal, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

// RequireRoot skips tests that need root (namespaces, mounts, cgroups).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates namespaces, mounts and cgroups")
	}
}

// Binaries builds bin/corral, bin/corral-init and bin/corral-initstub once
// into a temp dir of this test process and returns that dir. Nothing
// removes it at exit (a test binary has no exit hook), so each build first
// removes the dirs of test processes that are gone.
func Binaries(t testing.TB) string {
	t.Helper()
	dir, err := BuildBinaries()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// BuildBinaries is Binaries for callers without a testing.TB (TestMain).
func BuildBinaries() (string, error) {
	buildOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		removeStaleBinaries()
		binDir = filepath.Join(os.TempDir(), testbinPrefix+strconv.Itoa(os.Getpid()))
		if buildErr = os.RemoveAll(binDir); buildErr != nil {
			return
		}
		if buildErr = os.Mkdir(binDir, 0o755); buildErr != nil {
			return
		}
		for _, b := range []struct{ out, pkg, cgo string }{
			{"corral", "./cmd/corral", "1"},
			{"corral-init", "./cmd/corral-init", "0"},
			{"corral-agent", "./cmd/corral-agent", "0"},
		} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, b.out), b.pkg)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("build %s: %v\n%s", b.pkg, err, out)
				return
			}
		}
		buildErr = BuildInitStub(filepath.Join(binDir, "corral-initstub"))
	})
	return binDir, buildErr
}

const testbinPrefix = "corral-testbin-"

// removeStaleBinaries removes the binary dirs of test processes that have
// exited (about 75 MB each); a name that is no live pid counts as gone.
func removeStaleBinaries() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), testbinPrefix+"*"))
	for _, dir := range dirs {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(dir), testbinPrefix))
		if err == nil && pid > 0 && syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		os.RemoveAll(dir)
	}
}

// BuildInitStub compiles corral-initstub (as the Makefile does) to out.
func BuildInitStub(out string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	cmd := exec.Command("gcc", "-static", "-Os", "-s", "-Wall", "-Wl,-e,stub_entry", "-o", out, filepath.Join(root, "internal/guest/init/stub/stub.c"))
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build corral-initstub: %v\n%s", err, b)
	}
	return nil
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// UniqueName returns prefix-<8 hex>, for cgroup parents and labels.
func UniqueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// Server is a corral server running inside the test process.
type Server struct {
	*server.Server
	Config server.Config
	Client *client.Client
	Addr   string
}

// StartServer starts an in-process server with CleanupOnExit, so that its
// cleanup deletes every sandbox; it then asserts that no mount, cgroup or
// process of that server remains.
func StartServer(t testing.TB, mutate ...func(*server.Config)) *Server {
	t.Helper()
	RequireRoot(t)
	srv, err := Start(slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})), mutate...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop server: %v", err)
		}
		AssertNoLeaks(t, srv.Config.DataDir, srv.Config.CgroupParent)
		RemoveCgroupParent(srv.Config.CgroupParent)
		os.RemoveAll(srv.Config.DataDir)
	})
	return srv
}

// Start starts an in-process server on a fresh data dir and cgroup parent;
// the caller stops it with Stop and removes Config.DataDir.
func Start(logger *slog.Logger, mutate ...func(*server.Config)) (*Server, error) {
	bins, err := BuildBinaries()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "corral-test-")
	if err != nil {
		return nil, err
	}
	cfg := server.Config{
		DataDir:       dir,
		CgroupParent:  UniqueName("corral-test"),
		InitBinary:    filepath.Join(bins, "corral-init"),
		DiskPoolBytes: 8 << 30,
		CleanupOnExit: true,
		NoRaiseLimits: true, // tests leave the shared host's settings alone
		Logger:        logger,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	srv, err := server.Start(context.Background(), cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start server: %w", err)
	}
	addr := "unix://" + filepath.Join(dir, "corral.sock")
	c, err := client.New(addr)
	if err != nil {
		return nil, err
	}
	return &Server{Server: srv, Config: cfg, Client: c, Addr: addr}, nil
}

// Stop deletes every sandbox and stops the server.
func (s *Server) Stop() error {
	s.Client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return s.Server.Stop(ctx)
}

// RemoveCgroupParent removes the (empty) parent cgroup directories and
// those the node makes beside it (see besideParent).
func RemoveCgroupParent(parent string) {
	for _, p := range besideParent(parent) {
		for _, dir := range CgroupDirs(p) {
			_ = os.Remove(dir)
		}
	}
}

// besideParent is parent and the cgroups a node with that parent makes
// beside it: the best-effort sandboxes' parent, the parents of the
// microVMs' and VMs' VMM cgroups, and the daemon's own cgroup (corral
// serve's default --node-cgroup), which a daemon killed by a test leaves.
func besideParent(parent string) []string {
	return []string{parent, parent + cgroup.IdleSuffix, parent + "-microvm", parent + "-vm", parent + "-node"}
}

// AssertNoLeaks fails the test if a mount under dataDir, a cgroup under
// cgroupParent or the cgroups beside it (see besideParent), or a process
// in such a cgroup remains.
func AssertNoLeaks(t testing.TB, dataDir, cgroupParent string) {
	t.Helper()
	if mounts := MountsUnder(dataDir); len(mounts) > 0 {
		t.Errorf("mounts left under %s: %v", dataDir, mounts)
	}
	for _, p := range besideParent(cgroupParent) {
		for _, dir := range CgroupDirs(p) {
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if e.IsDir() {
					t.Errorf("cgroup left: %s", filepath.Join(dir, e.Name()))
				}
			}
		}
		// A sandbox's own cpu cgroup beside the parent (cgroup.FlatCPUSep).
		flat, _ := filepath.Glob("/sys/fs/cgroup/*/" + p + cgroup.FlatCPUSep + "*")
		for _, d := range flat {
			t.Errorf("cgroup left: %s", d)
		}
	}
	if pids := SandboxProcesses(cgroupParent); len(pids) > 0 {
		t.Errorf("sandbox processes left in cgroup %s: %v", cgroupParent, pids)
	}
}

// MountsUnder lists mount points (in this mount namespace) under dir.
func MountsUnder(dir string) []string {
	mounts, _ := mountinfo.Read()
	var out []string
	for _, m := range mounts {
		if strings.HasPrefix(m.MountPoint, dir) {
			out = append(out, m.MountPoint)
		}
	}
	return out
}

// CgroupDirs returns the existing directories of a cgroup parent in every
// hierarchy (v1 controllers and the v2 tree).
func CgroupDirs(parent string) []string {
	matches, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
	if st, err := os.Stat("/sys/fs/cgroup/" + parent); err == nil && st.IsDir() {
		matches = append(matches, "/sys/fs/cgroup/"+parent)
	}
	return matches
}

// SandboxProcesses returns pids of processes in any cgroup under
// cgroupParent, in any hierarchy: every sandbox process lives there.
func SandboxProcesses(cgroupParent string) []string {
	var pids []string
	needle := []byte("/" + cgroupParent + "/")
	flat := []byte("/" + cgroupParent + cgroup.FlatCPUSep) // the sandbox's own cpu cgroup
	for pid := range procfs.PIDs() {
		cg, err := os.ReadFile(procfs.Path(pid, "cgroup"))
		if err == nil && (bytes.Contains(cg, needle) || bytes.Contains(cg, flat)) && !isZombie(pid) {
			pids = append(pids, strconv.Itoa(pid))
		}
	}
	return pids
}

// NetNamespaces returns the network namespaces ("net:[inode]") that the
// given processes are in.
func NetNamespaces(pids []string) map[string]bool {
	out := map[string]bool{}
	for _, pid := range pids {
		if ns, err := os.Readlink(filepath.Join("/proc", pid, "ns", "net")); err == nil {
			out[ns] = true
		}
	}
	return out
}

// NamespaceHolders lists what still refers to any of the namespaces: a
// process inside one, an open fd of any process, or an nsfs bind mount.
func NamespaceHolders(namespaces map[string]bool) []string {
	var holders []string
	for pid := range procfs.PIDs() {
		if isZombie(pid) {
			continue
		}
		if ns, err := os.Readlink(procfs.Path(pid, "ns/net")); err == nil && namespaces[ns] {
			holders = append(holders, fmt.Sprintf("process %d", pid))
		}
		fds, _ := os.ReadDir(procfs.Path(pid, "fd"))
		for _, fd := range fds {
			if target, err := os.Readlink(procfs.Path(pid, "fd/"+fd.Name())); err == nil && namespaces[target] {
				holders = append(holders, fmt.Sprintf("fd %s of process %d", fd.Name(), pid))
			}
		}
	}
	table, _ := os.ReadFile("/proc/self/mountinfo")
	for ns := range namespaces {
		if bytes.Contains(table, []byte(ns)) {
			holders = append(holders, "nsfs mount of "+ns)
		}
	}
	return holders
}

// isZombie reports a process that has exited and waits for its parent to
// reap it: after a daemon restart a sandbox's init is reparented to the
// host's PID 1, which reaps on its own schedule. A zombie holds no resources.
func isZombie(pid int) bool {
	stat, err := os.ReadFile(procfs.Path(pid, "stat"))
	if err != nil {
		return true // gone already
	}
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
