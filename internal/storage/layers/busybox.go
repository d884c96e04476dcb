package layers

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// busyboxPaths are where a static busybox is looked for (Debian's
// busybox-static installs /bin/busybox).
var busyboxPaths = []string{"/bin/busybox", "/usr/bin/busybox", "/sbin/busybox", "/usr/sbin/busybox"}

// StaticBusybox returns the host's static busybox: the busybox image is
// built from it, and the container backend runs shell execs with it.
func StaticBusybox() (string, error) { return findBusybox() }

// findBusybox returns the first static busybox of busyboxPaths.
func findBusybox() (string, error) {
	for _, p := range busyboxPaths {
		if static, err := isStatic(p); err == nil && static {
			return p, nil
		}
	}
	return "", errdefs.FailedPrecondition("no static busybox at %s (apt-get install busybox-static)",
		strings.Join(busyboxPaths, ", "))
}

// isStatic reports whether the ELF file at p needs no dynamic loader.
func isStatic(p string) (bool, error) {
	f, err := elf.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return true, nil
}

// BuildBusybox fills rootfs with the busybox image: a static busybox, a
// symlink for each applet, and the few files programs expect in /etc. The
// benchmarks' runc peer runs it too.
func BuildBusybox(ctx context.Context, rootfs string, progress io.Writer) error {
	src, err := findBusybox()
	if err != nil {
		return err
	}
	err = mkdirs(rootfs, map[string]os.FileMode{
		".": 0o755, "bin": 0o755, "sbin": 0o755, "usr/bin": 0o755, "usr/sbin": 0o755,
		"etc": 0o755, "root": 0o700, "home": 0o755, "tmp": 0o777 | os.ModeSticky,
		"var/tmp": 0o777 | os.ModeSticky, "dev": 0o755, "proc": 0o555, "sys": 0o555,
	})
	if err != nil {
		return err
	}
	bin := filepath.Join(rootfs, "bin/busybox")
	if err := copyFile(src, bin, 0o755); err != nil {
		return err
	}
	n, err := linkApplets(ctx, rootfs, bin)
	if err != nil {
		return err
	}
	fmt.Fprintf(progress, "busybox: %s with %d applets\n", src, n)
	err = writeFiles(rootfs, map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
		"etc/hosts":  hostsFile,
	}, 0o644)
	if err != nil {
		return err
	}
	// Everything here is made now, with no mtime of its own to keep: the
	// busybox binary's mtime makes the recipe reproducible (same digest on
	// every build) with a date that tools accept (zip needs >= 1980).
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	return stampTree(rootfs, st.ModTime())
}

// linkApplets links every applet the busybox at bin reports to
// /bin/busybox, in the directory busybox itself names for it.
func linkApplets(ctx context.Context, rootfs, bin string) (int, error) {
	out, err := exec.CommandContext(ctx, bin, "--list-full").Output()
	prefix := "" // --list-full names each applet's directory
	if err != nil {
		// Older builds know only --list: put every applet in /bin.
		prefix = "bin/"
		if out, err = exec.CommandContext(ctx, bin, "--list").Output(); err != nil {
			return 0, fmt.Errorf("busybox --list: %w", err)
		}
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		applet := prefix + strings.TrimSpace(sc.Text())
		if applet == prefix || applet == "bin/busybox" || !filepath.IsLocal(applet) {
			continue
		}
		link := filepath.Join(rootfs, applet)
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return n, err
		}
		if err := os.Symlink("/bin/busybox", link); err != nil {
			return n, fmt.Errorf("applet %s: %w", applet, err)
		}
		n++
	}
	return n, sc.Err()
}

// copyFile copies src to a new file dst with exactly mode.
func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Chmod(mode); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
