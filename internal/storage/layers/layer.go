package layers

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
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Layer is one read-only EROFS layer of the store, known by a name and
// version. It is split in two files: the EROFS metadata (inodes,
// directories, small inlined files), always on local disk, and a data blob
// holding the contents of every other file in chunks, which the kernel
// reads as the image's extra device. The blob is what a lazy loader can
// fetch on demand (BlobSource); the metadata is small and always local.
type Layer struct {
	// Ref is NAME@VERSION, e.g. busybox@1.
	Ref string `json:"ref"`
	// Digest is "sha256:<hex>" of the metadata file followed by the blob:
	// the layer's identity.
	Digest string `json:"digest"`
	// MetaSize is the size of the metadata file in bytes.
	MetaSize int64 `json:"meta_size,omitempty"`
	// BlobDigest is "sha256:<hex>" of the data blob, BlobSize its size.
	// Both are empty for a layer of an earlier store version, which is one
	// EROFS file without a blob (it still mounts; rebuild it to split it).
	BlobDigest string `json:"blob_digest,omitempty"`
	BlobSize   int64  `json:"blob_size,omitempty"`
}

// Split reports whether the layer has a separate data blob.
func (l Layer) Split() bool { return l.BlobDigest != "" }

// Name and Version are the two halves of Ref.
func (l Layer) Name() string    { n, _, _ := strings.Cut(l.Ref, "@"); return n }
func (l Layer) Version() string { _, v, _ := strings.Cut(l.Ref, "@"); return v }

// BlobsDirName is the store's blobs directory (BlobsDir) inside its dir.
const BlobsDirName = "blobs"

const (
	layersDir  = "layers"
	blobsDir   = BlobsDirName
	indexFile  = "index.json"
	lockFile   = ".lock"
	layerExt   = ".erofs"
	blobExt    = ".blob"
	digestAlgo = "sha256"
	// erofsUUID is fixed so that the same tree always makes the same file.
	erofsUUID = "00000000-0000-0000-0000-000000000000"
	// ChunkSize is the blob's chunk size: the unit a lazy loader fetches.
	ChunkSize = 1 << 20
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

// index is layers/index.json: which digest each NAME@VERSION names, the
// files of each digest, and each name's latest version.
type index struct {
	Layers map[string]string `json:"layers"`
	// Digests describes each split layer; a digest without an entry is a
	// single-file layer of an earlier store version.
	Digests map[string]layerFiles `json:"digests,omitempty"`
	// Latest maps NAME to the version created last: what an unversioned
	// NAME in a composition resolves to, so that publishing a new version
	// upgrades every composition that follows NAME in one index write.
	Latest map[string]string `json:"latest,omitempty"`
	// Anonymous refs are layers made for compositions (imports): being
	// their name's latest version does not keep them.
	Anonymous map[string]bool `json:"anonymous,omitempty"`
	// Imports maps an imported image's manifest digest to its layers, so
	// that importing it again converts nothing.
	Imports map[string]importRecord `json:"imports,omitempty"`
}

type layerFiles struct {
	MetaSize   int64  `json:"meta_size"`
	BlobDigest string `json:"blob_digest"`
	BlobSize   int64  `json:"blob_size"`
}

// init makes the index's nil maps (a new or older index) empty ones.
func (idx *index) init() {
	if idx.Layers == nil {
		idx.Layers = map[string]string{}
	}
	if idx.Digests == nil {
		idx.Digests = map[string]layerFiles{}
	}
	if idx.Latest == nil {
		idx.Latest = map[string]string{}
	}
	if idx.Anonymous == nil {
		idx.Anonymous = map[string]bool{}
	}
	if idx.Imports == nil {
		idx.Imports = map[string]importRecord{}
	}
}

// layer returns the layer ref names.
func (idx index) layer(ref string) (Layer, bool) {
	d, ok := idx.Layers[ref]
	if !ok {
		return Layer{}, false
	}
	return idx.describe(ref, d), true
}

func (idx index) describe(ref, digest string) Layer {
	f := idx.Digests[digest]
	return Layer{Ref: ref, Digest: digest, MetaSize: f.MetaSize, BlobDigest: f.BlobDigest, BlobSize: f.BlobSize}
}

// latest returns the version of name created last. Indexes of an earlier
// store version have no Latest: the greatest version string stands in.
func (idx index) latest(name string) (string, bool) {
	if v, ok := idx.Latest[name]; ok {
		return v, true
	}
	best, found := "", false
	for ref := range idx.Layers {
		n, v, _ := strings.Cut(ref, "@")
		if n == name && (!found || v > best) {
			best, found = v, true
		}
	}
	return best, found
}

// metaFile is the EROFS metadata file of digest; mountPoint is where it
// is mounted; blobFile is where the local blob store keeps a blob.
func (s *Store) metaFile(digest string) string {
	return filepath.Join(s.layers, digestAlgo+"-"+strings.TrimPrefix(digest, digestAlgo+":")+layerExt)
}

func (s *Store) layerMount(digest string) string {
	return strings.TrimSuffix(s.metaFile(digest), layerExt)
}

func (s *Store) blobFile(blobDigest string) string {
	return filepath.Join(s.blobs, digestAlgo+"-"+strings.TrimPrefix(blobDigest, digestAlgo+":")+blobExt)
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

// lockedIndex takes the store's lock and reads the index under it; the
// caller runs unlock when done.
func (s *Store) lockedIndex() (idx index, unlock func(), err error) {
	if unlock, err = s.lockIndex(); err != nil {
		return idx, nil, err
	}
	if idx, err = s.readIndex(); err != nil {
		unlock()
		return idx, nil, err
	}
	return idx, unlock, nil
}

func (s *Store) readIndex() (index, error) {
	var idx index
	b, err := os.ReadFile(filepath.Join(s.layers, indexFile))
	if errors.Is(err, os.ErrNotExist) {
		idx.init()
		return idx, nil
	}
	if err != nil {
		return idx, fmt.Errorf("layer index: %w", err)
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return idx, fmt.Errorf("layer index %s: %w", indexFile, err)
	}
	idx.init()
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
		out = append(out, idx.describe(ref, d))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref < out[j].Ref })
	return out, ctx.Err()
}

// CreateLayer builds the layer ref (NAME@VERSION) from src, a directory or
// a tar file, and returns it. Files keep their owners, modes, mtimes and
// xattrs (the same tree gives the same digest); an overlay whiteout (a 0/0 character device) deletes a lower
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
		tmp, err := s.tarDir()
		if err != nil {
			return Layer{}, fmt.Errorf("layer %s: %w", ref, err)
		}
		defer os.RemoveAll(tmp)
		if err := extractTar(ctx, src, tmp); err != nil {
			return Layer{}, fmt.Errorf("layer %s: %w", ref, err)
		}
		dir = tmp
	}
	return s.createLayer(ctx, ref, dir, false, mkfsOptions{})
}

// createLayer makes a split EROFS layer of dir, records it as ref and
// hands it to the Publisher, if any; replace lets a recipe rebuild point
// ref at new content.
func (s *Store) createLayer(ctx context.Context, ref, dir string, replace bool, opts mkfsOptions) (Layer, error) {
	l, err := s.addLayer(ctx, ref, dir, replace, opts)
	if err != nil || s.publish == nil || !l.Split() {
		return l, err
	}
	// After the index lock is released: an upload can take a while.
	s.publish.Publish(ctx, l, s.metaFile(l.Digest), s.blobFile(l.BlobDigest))
	return l, nil
}

func (s *Store) addLayer(ctx context.Context, ref, dir string, replace bool, opts mkfsOptions) (Layer, error) {
	st, err := s.stage()
	if err != nil {
		return Layer{}, err
	}
	defer st.remove()
	l, err := s.mkfs(ctx, dir, st, opts)
	if err != nil {
		return Layer{}, fmt.Errorf("layer %s: %w", ref, err)
	}
	l.Ref = ref
	idx, unlock, err := s.lockedIndex()
	if err != nil {
		return Layer{}, err
	}
	defer unlock()
	if old, ok := idx.Layers[ref]; ok && old != l.Digest && !replace {
		return Layer{}, errdefs.AlreadyExists("name: layer %s exists with digest %s (versions are immutable: pick a new version)", ref, old)
	}
	// Files move into the store under the index lock, so that GC never
	// sees them without the index entry that keeps them.
	if err := s.storeFiles(st, l); err != nil {
		return Layer{}, fmt.Errorf("layer %s: %w", ref, err)
	}
	idx.Layers[ref] = l.Digest
	idx.Digests[l.Digest] = layerFiles{MetaSize: l.MetaSize, BlobDigest: l.BlobDigest, BlobSize: l.BlobSize}
	idx.Latest[l.Name()] = l.Version()
	if err := s.writeIndex(idx); err != nil {
		return Layer{}, fmt.Errorf("layer %s: %w", ref, err)
	}
	return l, nil
}

// mkfs builds a split EROFS layer of dir into st (storeFiles moves it into
// the store): metadata and a blob with the file contents in chunks
// (--blobdev), and returns it without a Ref. Options make it reproducible: a
// fixed UUID and a fixed build time in the superblock (buildEpoch). Owners,
// modes, mtimes and xattrs are kept as they are, so the same tree gives the
// same digest; the blob's path is not recorded in the metadata, so the blob
// can be served from anywhere.
func (s *Store) mkfs(ctx context.Context, dir string, st staged, opts mkfsOptions) (Layer, error) {
	bin, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		return Layer{}, errdefs.FailedPrecondition("needs mkfs.erofs (apt-get install erofs-utils): %v", err)
	}
	meta, blob := st.meta, st.blob
	args := []string{"--quiet", "-U" + erofsUUID, "--chunksize=" + strconv.Itoa(ChunkSize), "--blobdev=" + blob}
	for _, re := range opts.excludeRegexps {
		args = append(args, "--exclude-regex="+re)
	}
	cmd := exec.CommandContext(ctx, bin, append(args, meta, dir)...)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.Itoa(buildEpoch))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Start()
	if err == nil && opts.cpuSeconds > 0 {
		// Set at once after the start: mkfs has read nothing yet.
		lim := unix.Rlimit{Cur: opts.cpuSeconds, Max: opts.cpuSeconds + 1}
		if perr := unix.Prlimit(cmd.Process.Pid, unix.RLIMIT_CPU, &lim, nil); perr != nil {
			_ = cmd.Process.Kill()
		}
	}
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		return Layer{}, fmt.Errorf("mkfs.erofs %s: %w: %s", dir, err, strings.TrimSpace(out.String()))
	}
	layer := sha256.New()
	_, metaSize, err := hashFile(meta, layer)
	if err != nil {
		return Layer{}, err
	}
	blobDigest, blobSize, err := hashFile(blob, layer)
	if err != nil {
		return Layer{}, err
	}
	return Layer{Digest: digestAlgo + ":" + hex.EncodeToString(layer.Sum(nil)),
		MetaSize: metaSize, BlobDigest: blobDigest, BlobSize: blobSize}, nil
}

// staged are the temporary files of a layer being made, each in the
// directory it will be renamed into (layers/ is a mount of its own, so a
// rename from elsewhere would cross mounts). Open sweeps leftovers.
type staged struct{ meta, blob string }

func (s *Store) stage() (staged, error) {
	var st staged
	for _, f := range []struct {
		dir string
		p   *string
	}{{s.layers, &st.meta}, {s.blobs, &st.blob}} {
		tmp, err := os.CreateTemp(f.dir, tmpPrefix+"layer-")
		if err != nil {
			st.remove()
			return staged{}, err
		}
		tmp.Close()
		*f.p = tmp.Name()
	}
	return st, nil
}

// remove deletes what is left of st (nothing after storeFiles).
func (st staged) remove() {
	for _, p := range []string{st.meta, st.blob} {
		if p != "" {
			_ = os.Remove(p) // fails harmlessly after the rename
		}
	}
}

// storeFiles moves the metadata and blob mkfs made into the store. The
// same content may exist already: a rename over it changes nothing.
func (s *Store) storeFiles(st staged, l Layer) error {
	if err := os.Rename(st.blob, s.blobFile(l.BlobDigest)); err != nil {
		return fmt.Errorf("store blob: %w", err)
	}
	if err := os.Rename(st.meta, s.metaFile(l.Digest)); err != nil {
		return fmt.Errorf("store layer: %w", err)
	}
	return syncfs(s.layers)
}

// buildEpoch is the build time mkfs.erofs records (SOURCE_DATE_EPOCH),
// instead of the clock, so that the same tree gives the same image. It
// also clamps: mkfs 1.5 caps each file's mtime at it, so it lies far ahead
// (2100-01-01) and every real mtime stays as it is.
const buildEpoch = 4102444800

// mkfsOptions change how mkfs builds a layer.
type mkfsOptions struct {
	// excludeRegexps leave out paths (relative to the tree, no leading /)
	// that match; a directory's whole subtree goes with it.
	excludeRegexps []string
	// cpuSeconds bounds mkfs.erofs's CPU time (RLIMIT_CPU); 0: none.
	cpuSeconds uint64
}

// hashFile fsyncs path, makes it read-only and returns its digest and
// size; its bytes are also written to also.
func hashFile(path string, also io.Writer) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(h, also), f)
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Chmod(path, 0o444)
	}
	if err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", path, err)
	}
	return digestAlgo + ":" + hex.EncodeToString(h.Sum(nil)), n, nil
}

// extractTar unpacks the tar file src into dir, then turns OCI whiteouts
// into overlay ones.
func extractTar(ctx context.Context, src, dir string) error {
	f, err := os.Open(src)
	if err != nil {
		return errdefs.InvalidArgument("path: %v", err)
	}
	defer f.Close()
	if err := untar(ctx, f, dir, false); err != nil {
		return errdefs.InvalidArgument("path: %s: %v", src, err)
	}
	return convertWhiteouts(dir)
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
			// Both namespaces: the node's overlays read trusted.*, the
			// views init mounts inside a sandbox's user namespace (fncall
			// pools) can only use user.* (the userxattr option).
			for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
				if err := unix.Lsetxattr(parent, attr, []byte("y"), 0); err != nil {
					return fmt.Errorf("opaque %s: %w", parent, err)
				}
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
