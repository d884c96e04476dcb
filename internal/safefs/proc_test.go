package safefs

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// chrooted starts a process chrooted into root in a private mount namespace
// where root has a small tmpfs at /small, a read-only tmpfs at /ro and
// procfs at /proc, a tmpfs at /t/m, and returns its pid once it is in place.
func chrooted(t *testing.T, root string) int {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount namespaces)")
	}
	for _, bin := range []string{"unshare", "mount", "chroot"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s: %v", bin, err)
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("needs a static /bin/busybox: %v", err)
	}
	for _, d := range []string{"bin", "small", "ro", "proc", "t/m"} {
		must(t, os.MkdirAll(root+"/"+d, 0o755))
	}
	must(t, os.WriteFile(root+"/bin/busybox", bb, 0o755))
	script := fmt.Sprintf(`set -e
mount -t tmpfs -o size=64k tmpfs %[1]s/small
mount -t tmpfs -o ro tmpfs %[1]s/ro
mount -t proc proc %[1]s/proc
mount -t tmpfs tmpfs %[1]s/t/m
echo ready
exec chroot %[1]s /bin/busybox sleep 600`, root)
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", script)
	out, err := cmd.StdoutPipe()
	must(t, err)
	cmd.Stderr = os.Stderr
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("namespace setup: %q", line)
	}
	pid := cmd.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if dst, _ := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); dst == root {
			return pid
		}
	}
	t.Fatal("process never chrooted")
	return 0
}

// TestThroughProcRoot serves files of a process in its own mount namespace
// through /proc/<pid>/root, as the node does.
func TestThroughProcRoot(t *testing.T) {
	s := newSandbox(t)
	s.escapeLinks(t)
	pid := chrooted(t, s.root)
	fsys := New(func() (*os.File, error) {
		return os.OpenFile(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY, 0)
	})
	ctx := context.Background()

	// The tmpfs exists only in the process's namespace.
	must(t, write(fsys, "/small/x", "in ns", backend.WriteOptions{}))
	if got, err := read(t, fsys, "/escape/small/x", 0, 0); err != nil || got != "in ns" {
		t.Fatalf("read back: %q %v", got, err)
	}
	if _, err := os.Stat(s.root + "/small/x"); !os.IsNotExist(err) {
		t.Fatalf("file visible on the host side of the mount: %v", err)
	}
	_, err := fsys.WriteFile(ctx, "/small/big", strings.NewReader(strings.Repeat("x", 1<<20)), backend.WriteOptions{})
	wantErr(t, err, errdefs.ErrResourceExhausted, `"/small/big"`)
	wantErr(t, write(fsys, "/ro/x", "x", backend.WriteOptions{}), errdefs.ErrPermissionDenied, `"/ro/x": read-only`)

	// Kernel files and magic links are refused.
	_, err = read(t, fsys, "/proc/version", 0, 0)
	wantErr(t, err, errdefs.ErrPermissionDenied, "kernel filesystem (proc)")
	wantErr(t, write(fsys, "/proc/self/comm", "pwned", backend.WriteOptions{}), errdefs.ErrPermissionDenied, "proc")
	wantErr(t, fsys.MakeDir(ctx, "/proc/x", 0, false), errdefs.ErrPermissionDenied, "proc")
	// (/proc/1 may already fail the ptrace access check: EACCES.)
	if _, err = read(t, fsys, "/proc/1/root/etc/hostname", 0, 0); !errdefs.IsInvalidArgument(err) && !errdefs.IsPermissionDenied(err) {
		t.Fatalf("/proc/1/root: %v", err)
	}
	_, err = read(t, fsys, fmt.Sprintf("/proc/%d/cwd/etc/passwd", pid), 0, 0)
	wantErr(t, err, errdefs.ErrInvalidArgument, "magic link")

	// Recursive remove leaves mount points (and what is on them) alone.
	wantErr(t, fsys.Remove(ctx, "/small", true), errdefs.ErrFailedPrecondition, `"/small": is a mount point`)
	must(t, write(fsys, "/t/m/keep", "x", backend.WriteOptions{}))
	must(t, write(fsys, "/t/a/f", "x", backend.WriteOptions{MakeParents: true}))
	wantErr(t, fsys.Remove(ctx, "/t", true), errdefs.ErrFailedPrecondition, `"/t/m": is a mount point`)
	if _, err := fsys.Stat(ctx, "/t/m/keep"); err != nil {
		t.Fatalf("remove entered a mount point: %v", err)
	}
	if _, err := fsys.Stat(ctx, "/small/x"); err != nil {
		t.Fatalf("remove entered a mount point: %v", err)
	}
	s.checkCanary(t)
}
