package microvm

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// guestModules are the modules the agent needs, in load order before
// dependencies are added: virtio-mmio transport, block devices, the
// virtio-serial port, free page reporting (the balloon), the NIC of a
// networked sandbox, and the filesystems of the root. crc32c_generic
// comes first because libcrc32c asks for the "crc32c" transform at load
// and the guest has no modprobe to find it.
var guestModules = []string{
	"virtio_mmio", "virtio_blk", "virtio_console", "virtio_balloon", "virtio_net",
	"crc32c_generic", "ext4", "erofs", "overlay",
}

// vsockModules are added for Firecracker, whose agent channel is vsock.
var vsockModules = []string{"vmw_vsock_virtio_transport"}

// resolveModules returns the module files for names and everything they
// depend on, dependencies first, from modules.dep of kernel release dir.
func resolveModules(moddir string, names []string) ([]string, error) {
	f, err := os.Open(filepath.Join(moddir, "modules.dep"))
	if err != nil {
		return nil, errdefs.NotSupported("microvm: kernel modules: %v (needs linux-image-amd64 installed)", err)
	}
	defer f.Close()
	deps := map[string][]string{} // module path -> dependency paths
	byName := map[string]string{} // module name -> path
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		deps[mod] = strings.Fields(rest)
		byName[moduleName(mod)] = mod
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read modules.dep: %w", err)
	}
	var out []string
	seen := map[string]bool{}
	var add func(mod string)
	add = func(mod string) {
		if seen[mod] {
			return
		}
		seen[mod] = true
		// modules.dep lists every (transitive) dependency, the deepest last.
		d := deps[mod]
		for i := len(d) - 1; i >= 0; i-- {
			add(d[i])
		}
		out = append(out, mod)
	}
	for _, n := range names {
		mod, ok := byName[n]
		if !ok {
			continue // built into this kernel
		}
		add(mod)
	}
	return out, nil
}

func moduleName(p string) string {
	base := path.Base(p)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// initramfs is the guest's base initramfs: the agent as /init, a static
// busybox for shell execs and the kernel modules. Each sandbox's initrd is
// this file with a small second archive appended that holds its config
// (the kernel unpacks concatenated archives in order).
type initramfs struct {
	path    string
	modules []string // paths inside the archive, load order
}

// buildInitramfs writes the base initramfs into dir (once per content:
// the name carries a digest of the inputs) and returns it.
func buildInitramfs(dir, agentBin, busybox, moddir string, modNames []string) (*initramfs, error) {
	mods, err := resolveModules(moddir, modNames)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	for _, p := range append([]string{agentBin, busybox}, mods...) {
		src := p
		if !filepath.IsAbs(src) {
			src = filepath.Join(moddir, p)
		}
		st, err := os.Stat(src)
		if err != nil {
			return nil, fmt.Errorf("initramfs input: %w", err)
		}
		fmt.Fprintf(h, "%s %d %d\n", src, st.Size(), st.ModTime().UnixNano())
	}
	ir := &initramfs{path: filepath.Join(dir, "initramfs-"+hex.EncodeToString(h.Sum(nil))[:16]+".cpio")}
	for _, m := range mods {
		ir.modules = append(ir.modules, "/corral/modules/"+path.Base(m))
	}
	if _, err := os.Stat(ir.path); err == nil {
		return ir, nil
	}
	tmp, err := os.CreateTemp(dir, ".tmp-initramfs-")
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	defer os.Remove(tmp.Name())
	w := newCpio(bufio.NewWriterSize(tmp, 1<<20))
	for _, d := range []string{"corral", "corral/modules", "dev", "proc", "sys"} {
		w.dir(d, 0o755)
	}
	w.charDev("dev/console", 0o600, 5, 1)
	if err := w.file("init", agentBin, 0o755); err != nil {
		return nil, err
	}
	if err := w.file(strings.TrimPrefix(agentproto.BusyboxPath, "/"), busybox, 0o755); err != nil {
		return nil, err
	}
	for i, m := range mods {
		if err := w.file(strings.TrimPrefix(ir.modules[i], "/"), filepath.Join(moddir, m), 0o644); err != nil {
			return nil, err
		}
	}
	if err := w.close(); err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	if err := os.Rename(tmp.Name(), ir.path); err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	return ir, nil
}

// writeInitrd writes dst: the base initramfs followed by an archive with
// the sandbox's config (and secret), readable by the node only.
func (ir *initramfs) writeInitrd(dst string, cfg agentproto.FileConfig) error {
	cfg.Modules = ir.modules
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	src, err := os.Open(ir.path)
	if err != nil {
		return fmt.Errorf("initrd: %w", err)
	}
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("initrd: %w", err)
	}
	if _, err := io.Copy(out, src); err != nil {
		out.Close()
		return fmt.Errorf("initrd: %w", err)
	}
	w := newCpio(bufio.NewWriter(out))
	w.bytes(strings.TrimPrefix(agentproto.ConfigPath, "/"), b, 0o600)
	if err := w.close(); err != nil {
		out.Close()
		return fmt.Errorf("initrd: %w", err)
	}
	return out.Close()
}

// cpioWriter writes the "newc" cpio format the kernel unpacks.
type cpioWriter struct {
	w    *bufio.Writer
	ino  uint32
	off  int64
	err  error
	zero [4]byte
}

func newCpio(w *bufio.Writer) *cpioWriter { return &cpioWriter{w: w, ino: 1} }

func (c *cpioWriter) header(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) {
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad()
}

func (c *cpioWriter) write(p []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(p)
	c.off += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.off % 4; r != 0 {
		c.write(c.zero[:4-r])
	}
}

const (
	sIFDIR = 0o040000
	sIFREG = 0o100000
	sIFCHR = 0o020000
)

func (c *cpioWriter) dir(name string, perm uint32) { c.header(name, sIFDIR|perm, 0, 0, 0) }

func (c *cpioWriter) charDev(name string, perm, major, minor uint32) {
	c.header(name, sIFCHR|perm, 0, major, minor)
}

func (c *cpioWriter) bytes(name string, b []byte, perm uint32) {
	c.header(name, sIFREG|perm, int64(len(b)), 0, 0)
	c.write(b)
	c.pad()
}

func (c *cpioWriter) file(name, src string, perm uint32) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	c.header(name, sIFREG|perm, st.Size(), 0, 0)
	if c.err == nil {
		n, err := io.Copy(c.w, f)
		c.off += n
		c.err = err
	}
	c.pad()
	return nil
}

func (c *cpioWriter) close() error {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	if c.err != nil {
		return c.err
	}
	return c.w.Flush()
}
