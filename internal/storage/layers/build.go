package layers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// recipe makes one built-in image.
type recipe struct {
	env []string
	// build fills rootfs, a directory that does not exist yet.
	build func(ctx context.Context, rootfs string, progress io.Writer) error
}

var recipes = map[string]recipe{
	"busybox": {env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, build: BuildBusybox},
	"debian": {env: []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG=C.UTF-8",
	}, build: buildDebian},
}

func recipeNames() string {
	names := make([]string, 0, len(recipes))
	for n := range recipes {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// recipeVersion is the layer version a recipe builds: NAME@1.
const recipeVersion = "1"

// make builds name's rootfs into a temporary directory of the store, turns
// it into the layer NAME@1 (replacing an earlier build of it), and moves
// the image's composition into place in one rename, so that a crash leaves
// either the old image or the new one (and .tmp- leftovers that Open
// removes), never half of one.
func (s *Store) make(ctx context.Context, name string, r recipe, progress io.Writer) error {
	tmp, err := os.MkdirTemp(s.dir, tmpPrefix+name+"-")
	if err != nil {
		return err
	}
	// After an exchange, tmp holds the replaced image: remove it too.
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil { // MkdirTemp made it 0700
		return err
	}
	rootfs := filepath.Join(tmp, "rootfs")
	if err := r.build(ctx, rootfs, progress); err != nil {
		return err
	}
	if err := seal(rootfs); err != nil {
		return err
	}
	l, err := s.createLayer(ctx, name+"@"+recipeVersion, rootfs, true, mkfsOptions{})
	if err != nil {
		return err
	}
	fmt.Fprintf(progress, "%s: layer %s %s\n", name, l.Ref, l.Digest)
	if err := os.RemoveAll(rootfs); err != nil {
		return err
	}
	m, err := json.MarshalIndent(meta{Name: name, Recipe: name, Env: r.env, Layers: []Layer{l}}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, metaFile), append(m, '\n'), 0o644); err != nil {
		return err
	}
	if err := syncfs(tmp); err != nil {
		return err
	}
	return publish(tmp, filepath.Join(s.dir, name))
}

// seal makes the rootfs directory itself root-owned and 0755. Files inside
// keep the owners and modes the recipe gave them.
func seal(rootfs string) error {
	if err := os.Lchown(rootfs, 0, 0); err != nil {
		return fmt.Errorf("seal rootfs: %w", err)
	}
	if err := os.Chmod(rootfs, 0o755); err != nil {
		return fmt.Errorf("seal rootfs: %w", err)
	}
	return nil
}

// syncfs flushes the filesystem holding dir, so that the rename that
// publishes a build never points at data still in memory.
func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

// publish moves the finished build tmp to dst: a plain rename when dst is
// new, an atomic exchange when it replaces an image (tmp then holds the old
// one).
func publish(tmp, dst string) error {
	err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
	if err == unix.EEXIST {
		err = unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE)
	}
	if err != nil {
		return fmt.Errorf("publish %s: %w", dst, err)
	}
	return syncfs(filepath.Dir(dst))
}

// mkdirs makes directories under root with exact modes (no umask).
func mkdirs(root string, dirs map[string]fs.FileMode) error {
	names := make([]string, 0, len(dirs))
	for d := range dirs {
		names = append(names, d)
	}
	sort.Strings(names) // parents first
	for _, d := range names {
		p := filepath.Join(root, d)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, dirs[d]); err != nil {
			return err
		}
	}
	return nil
}

// writeFiles writes small files under root with exact modes.
func writeFiles(root string, files map[string]string, mode fs.FileMode) error {
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			return err
		}
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
	}
	return nil
}

// stampTree sets the mtime and atime of everything under root, root
// included, to t (symlinks themselves, not their targets).
func stampTree(root string, t time.Time) error {
	ts := []unix.Timespec{unix.NsecToTimespec(t.UnixNano()), unix.NsecToTimespec(t.UnixNano())}
	return filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stamp %s: %w", p, err)
		}
		return nil
	})
}

// hostsFile is /etc/hosts for images without a network of their own.
const hostsFile = `127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
`
