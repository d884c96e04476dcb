package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Layer is one read-only EROFS layer of the store: content-addressed by
// the sha256 of its image file, and known by a name and version.
type Layer struct {
	// Ref is NAME@VERSION, e.g. busybox@1.
	Ref string `json:"ref"`
	// Digest is "sha256:<hex>" of the EROFS image file.
	Digest string `json:"digest"`
}

const (
	layersDir  = "layers"
	indexFile  = "index.json"
	lockFile   = ".lock"
	layerExt   = ".erofs"
	digestAlgo = "sha256"
	// erofsUUID is fixed so that the same tree always makes the same file.
	erofsUUID = "00000000-0000-0000-0000-000000000000"
)

var (
	versionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	digestRE  = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// checkRef validates a layer reference NAME@VERSION (field "name").
func checkRef(ref string) error {
	name, version, ok := strings.Cut(ref, "@")
	if !ok || !nameRE.MatchString(name) || !versionRE.MatchString(version) {
		return errdefs.InvalidArgument("name: %q must look like NAME@VERSION (NAME of a-z, 0-9, '.', '_', '-'; VERSION of A-Z, a-z, 0-9, '.', '_', '-'), e.g. busybox@1", ref)
	}
	return nil
}

// index is layers/index.json: which digest each NAME@VERSION names.
type index struct {
	Layers map[string]string `json:"layers"`
}

// layerFile is the EROFS image file of digest; layerMount is where it is
// mounted.
func (s *Store) layerFile(digest string) string {
	return filepath.Join(s.layers, digestAlgo+"-"+strings.TrimPrefix(digest, digestAlgo+":")+layerExt)
}

func (s *Store) layerMount(digest string) string {
	return strings.TrimSuffix(s.layerFile(digest), layerExt)
}

// lockIndex takes an exclusive flock on the layer store, which serializes
// index updates between processes (the daemon and the CLI).
func (s *Store) lockIndex() (func(), error) {
	f, err := os.OpenFile(filepath.Join(s.layers, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("layer store: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("layer store: lock: %w", err)
	}
	return func() { f.Close() }, nil
}

func (s *Store) readIndex() (index, error) {
	idx := index{Layers: map[string]string{}}
	b, err := os.ReadFile(filepath.Join(s.layers, indexFile))
	if errors.Is(err, os.ErrNotExist) {
		return idx, nil
	}
	if err != nil {
		return idx, fmt.Errorf("layer index: %w", err)
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return idx, fmt.Errorf("layer index %s: %w", indexFile, err)
	}
	if idx.Layers == nil {
		idx.Layers = map[string]string{}
	}
	return idx, nil
}

// writeIndex replaces index.json atomically (temp file, fsync, rename).
func (s *Store) writeIndex(idx index) error {
	b, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(s.layers, indexFile), append(b, '\n'))
}

// writeAtomic writes b to path through a temporary file and a rename.
func writeAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), tmpPrefix+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // fails harmlessly after the rename
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Layers returns the store's layers sorted by reference.
func (s *Store) Layers(ctx context.Context) ([]Layer, error) {
	idx, err := s.readIndex()
	if err != nil {
		return nil, err
	}
	out := make([]Layer, 0, len(idx.Layers))
	for ref, d := range idx.Layers {
		out = append(out, Layer{Ref: ref, Digest: d})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref < out[j].Ref })
	return out, ctx.Err()
}

// CreateLayer builds the layer ref (NAME@VERSION) from src, a directory or
// a tar file, and returns it. Files keep their owners, modes and xattrs,
// not their mtimes (all 0, so that the same tree gives the same digest); an overlay whiteout (a 0/0 character device) deletes a lower
// layer's file, and in a tar the OCI whiteouts .wh.NAME and .wh..wh..opq
// are converted to overlay ones. Versions are immutable: creating an
// existing ref with other content fails (errdefs.AlreadyExists), with the
// same content returns the existing layer.
func (s *Store) CreateLayer(ctx context.Context, ref, src string) (Layer, error) {
	if err := checkRef(ref); err != nil {
		return Layer{}, err
	}
	st, err := os.Stat(src)
	if err != nil {
		return Layer{}, errdefs.InvalidArgument("path: %v", err)
	}
	dir := src
	if !st.IsDir() {
		if !st.Mode().IsRegular() {
			return Layer{}, errdefs.InvalidArgument("path: %s is neither a directory nor a tar file", src)
		}
		tmp, err := os.MkdirTemp(s.layers, tmpPrefix+"tar-")
		if err != nil {
			return Layer{}, fmt.Errorf("layer %s: %w", ref, err)
		}
		defer os.RemoveAll(tmp)
		// The root's mode unless the tar has a "./" entry (MkdirTemp made
		// it 0700).
		if err := os.Chmod(tmp, 0o755); err != nil {
			return Layer{}, err
		}
		if err := extractTar(ctx, src, tmp); err != nil {
			return Layer{}, fmt.Errorf("layer %s: %w", ref, err)
		}
		dir = tmp
	}
	return s.createLayer(ctx, ref, dir, false)
}

// createLayer makes an EROFS image of dir and records it as ref; replace
// lets a recipe rebuild point ref at new content.
func (s *Store) createLayer(ctx context.Context, ref, dir string, replace bool) (Layer, error) {
	digest, err := s.mkfs(ctx, dir)
	if err != nil {
		return Layer{}, fmt.Errorf("layer %s: %w", ref, err)
	}
	unlock, err := s.lockIndex()
	if err != nil {
		return Layer{}, err
	}
	defer unlock()
	idx, err := s.readIndex()
	if err != nil {
		return Layer{}, err
	}
	if old, ok := idx.Layers[ref]; ok && old != digest && !replace {
		return Layer{}, errdefs.AlreadyExists("name: layer %s exists with digest %s (versions are immutable: pick a new version)", ref, old)
	}
	idx.Layers[ref] = digest
	if err := s.writeIndex(idx); err != nil {
		return Layer{}, fmt.Errorf("layer %s: %w", ref, err)
	}
	return Layer{Ref: ref, Digest: digest}, nil
}

// mkfs builds an EROFS image of dir into the store and returns its digest.
// Options make it reproducible: a fixed UUID and every mtime 0 (-T0: this
// mkfs.erofs, 1.5, either sets all mtimes to one time or stamps the
// superblock with the build time; see keepPycValid). Owners, modes and
// xattrs are kept as they are, so the same tree gives the same digest.
func (s *Store) mkfs(ctx context.Context, dir string) (string, error) {
	bin, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		return "", errdefs.FailedPrecondition("needs mkfs.erofs (apt-get install erofs-utils): %v", err)
	}
	f, err := os.CreateTemp(s.layers, tmpPrefix+"layer-")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	f.Close()
	defer os.Remove(tmp) // fails harmlessly after the rename
	cmd := exec.CommandContext(ctx, bin, "--quiet", "-T0", "-U"+erofsUUID, tmp, dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("mkfs.erofs %s: %w: %s", dir, err, strings.TrimSpace(string(out)))
	}
	f, err = os.Open(tmp)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	if err != nil {
		return "", fmt.Errorf("hash layer: %w", err)
	}
	digest := digestAlgo + ":" + hex.EncodeToString(h.Sum(nil))
	if err := os.Chmod(tmp, 0o444); err != nil {
		return "", err
	}
	// The same content may exist already: a rename over it changes nothing.
	if err := os.Rename(tmp, s.layerFile(digest)); err != nil {
		return "", fmt.Errorf("store layer: %w", err)
	}
	return digest, syncfs(s.layers)
}

// extractTar unpacks the tar file src into dir with GNU tar, keeping
// numeric owners, modes and xattrs, then turns OCI whiteouts into overlay
// ones.
func extractTar(ctx context.Context, src, dir string) error {
	cmd := exec.CommandContext(ctx, "tar", "-x", "-f", src, "-C", dir, "--numeric-owner",
		"--same-owner", "--same-permissions", "--xattrs", "--xattrs-include=*")
	if out, err := cmd.CombinedOutput(); err != nil {
		return errdefs.InvalidArgument("path: extract tar %s: %v: %s", src, err, strings.TrimSpace(string(out)))
	}
	if err := convertWhiteouts(dir); err != nil {
		return err
	}
	return keepPycValid(dir)
}

// convertWhiteouts replaces OCI whiteout files (.wh.NAME deletes NAME,
// .wh..wh..opq makes its directory opaque) by overlayfs ones.
func convertWhiteouts(root string) error {
	return filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if !strings.HasPrefix(name, ".wh.") || p == root {
			return nil
		}
		parent := filepath.Dir(p)
		if err := os.RemoveAll(p); err != nil {
			return err
		}
		if name == ".wh..wh..opq" {
			if err := unix.Lsetxattr(parent, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
				return fmt.Errorf("opaque %s: %w", parent, err)
			}
			return nil
		}
		target := filepath.Join(parent, strings.TrimPrefix(name, ".wh."))
		if err := os.RemoveAll(target); err != nil {
			return err
		}
		if err := unix.Mknod(target, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("whiteout %s: %w", target, err)
		}
		if d.IsDir() {
			return filepath.SkipDir
		}
		return nil
	})
}
