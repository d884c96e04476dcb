package layers

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// debianPackages are added to Debian's minbase: enough for SWE-style tasks
// (python3, git) and for looking around (procps, less); ca-certificates
// for when a network policy allows TLS.
var debianPackages = []string{"python3", "git", "procps", "ca-certificates", "less"}

// debianSuite is the release built, from the host's own apt sources.
const debianSuite = "bookworm"

// mmdebstrapArgs builds a minbase rootfs without man pages, docs (license
// files kept) and translations.
func mmdebstrapArgs(rootfs string) []string {
	return []string{
		"--mode=root", "--variant=minbase",
		"--include=" + strings.Join(debianPackages, ","),
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-include=/usr/share/locale/locale.alias",
		debianSuite, rootfs,
	}
}

// buildDebian makes a Debian minbase image with mmdebstrap (about half a
// minute to a minute), streaming its output to progress.
func buildDebian(ctx context.Context, rootfs string, progress io.Writer) error {
	bin, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return errdefs.FailedPrecondition("needs mmdebstrap (apt-get install mmdebstrap): %v", err)
	}
	if os.Geteuid() != 0 {
		return errdefs.FailedPrecondition("needs root (mmdebstrap --mode=root)")
	}
	tail := &tailWriter{max: 4 << 10}
	cmd := exec.CommandContext(ctx, bin, mmdebstrapArgs(rootfs)...)
	cmd.Stdout = io.MultiWriter(lenient{progress}, tail)
	cmd.Stderr = cmd.Stdout
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own mount namespace: the /proc, /dev and /sys mounts
		// mmdebstrap makes in the target die with it, even when it is
		// killed, so removing a failed build never descends into them.
		Unshareflags: syscall.CLONE_NEWNS,
		Setpgid:      true, // cancel kills apt and dpkg too
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("mmdebstrap: %w", ctx.Err())
		}
		return fmt.Errorf("mmdebstrap: %w; last output:\n%s", err, tail.String())
	}
	return fixDebian(rootfs)
}

// fixDebian replaces what mmdebstrap copied from the host (hostname, DNS
// servers) and makes sure the user nobody exists.
func fixDebian(rootfs string) error {
	err := writeFiles(rootfs, map[string]string{
		"etc/hostname":    "localhost\n",
		"etc/hosts":       hostsFile,
		"etc/resolv.conf": "",
	}, 0o644)
	if err != nil {
		return err
	}
	if err := ensureLine(rootfs, "etc/passwd", "nobody:", "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"); err != nil {
		return err
	}
	return ensureLine(rootfs, "etc/group", "nogroup:", "nogroup:x:65534:")
}

// ensureLine appends line to the file unless a line starts with prefix.
func ensureLine(rootfs, name, prefix, line string) error {
	p := filepath.Join(rootfs, name)
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			return nil
		}
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	return os.WriteFile(p, append(b, line+"\n"...), 0o644)
}

// lenient drops its writer's errors: a progress reader that went away must
// not fail the build.
type lenient struct{ w io.Writer }

func (l lenient) Write(p []byte) (int, error) {
	_, _ = l.w.Write(p) // best effort
	return len(p), nil
}

// tailWriter keeps the last max bytes written, for error messages.
type tailWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if over := len(w.buf) - w.max; over > 0 {
		w.buf = append(w.buf[:0], w.buf[over:]...)
	}
	return len(p), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}
