package layers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Import turns an OCI or Docker image into a composition. Each image
// layer becomes one EROFS layer (kept per layer, not flattened: images
// that share a base share its layers, and a layer is converted once), named
// oci-<diffid prefix>@1 and known to the store as anonymous: nothing
// keeps it but the compositions that use it. Every byte is checked against
// the digest chain (index -> manifest -> config -> diff_ids) before the
// layer is recorded, and a failed import removes every layer it made.

// Import source prefixes; anything else is a registry reference.
const (
	SourceOCILayout     = "oci:"            // oci:DIR[:REF]
	SourceDockerArchive = "docker-archive:" // docker-archive:FILE[:REPO:TAG]
)

// ImportOptions says what to import and how.
type ImportOptions struct {
	// Source is a registry reference (host/repo:tag or @sha256:...),
	// oci:DIR[:REF] (an OCI image layout) or docker-archive:FILE[:REPO:TAG]
	// (a `docker save` tarball).
	Source string
	// Ref is the composition NAME@VERSION to record.
	Ref string
	// Insecure allows a registry over plain HTTP.
	Insecure bool
	// Progress, when set, is called as the import advances.
	Progress func(ImportProgress)
}

// ImportProgress is how far an import is.
type ImportProgress struct {
	// Layer is the image layer being converted (1-based) of Layers; 0
	// while the image's manifest and config are read.
	Layer, Layers int
	// Bytes are the uncompressed bytes of the image read so far.
	Bytes int64
	// Cached is set for a layer converted by an earlier import.
	Cached bool
}

// Imported is the result of an import.
type Imported struct {
	Composition Composition
	// ImageDigest is the image manifest's digest, the import's cache key.
	ImageDigest string
	Layers      []Layer
	// Cached: the image had been imported before; nothing was converted.
	Cached bool
}

// importRecord is what the index keeps of an imported image.
type importRecord struct {
	Layers []string `json:"layers"`
	Env    []string `json:"env,omitempty"`
}

// Import imports opts.Source as the composition opts.Ref.
func (s *Store) Import(ctx context.Context, opts ImportOptions) (Imported, error) {
	if err := checkRef(opts.Ref); err != nil {
		return Imported{}, err
	}
	if opts.Progress == nil {
		opts.Progress = func(ImportProgress) {}
	}
	img, err := openImage(ctx, opts)
	if err != nil {
		return Imported{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return Imported{}, errdefs.InvalidArgument("source: %s: manifest: %v", opts.Source, err)
	}
	out := Imported{ImageDigest: digest.String()}
	idx, err := s.readIndex()
	if err != nil {
		return Imported{}, err
	}
	if rec, ok := idx.Imports[out.ImageDigest]; ok && idx.hasAll(rec.Layers) {
		out.Cached = true
		return s.recordImport(ctx, out, opts.Ref, rec)
	}
	// A taken name fails before the work, not after it.
	if c, err := s.composition(opts.Ref); err == nil {
		return Imported{}, errdefs.AlreadyExists("name: composition %s exists with layers %s (compositions are immutable: pick a new version)", c.Ref, strings.Join(c.Layers, ", "))
	}
	rec, layers, err := s.convert(ctx, img, opts)
	if err != nil {
		return Imported{}, fmt.Errorf("import %s: %w", opts.Source, err)
	}
	unlock, err := s.lockIndex()
	if err != nil {
		return Imported{}, err
	}
	idx, err = s.readIndex()
	if err == nil {
		idx.Imports[out.ImageDigest] = rec
		err = s.writeIndex(idx)
	}
	unlock()
	if err != nil {
		s.discard(layers)
		return Imported{}, fmt.Errorf("import %s: %w", opts.Source, err)
	}
	return s.recordImport(ctx, out, opts.Ref, rec)
}

// recordImport creates the composition of an imported image.
func (s *Store) recordImport(ctx context.Context, out Imported, ref string, rec importRecord) (Imported, error) {
	c, err := s.CreateComposition(ctx, Composition{Ref: ref, Layers: rec.Layers, Env: rec.Env})
	if err != nil {
		return Imported{}, err
	}
	idx, err := s.readIndex()
	if err != nil {
		return Imported{}, err
	}
	out.Composition = c
	for _, r := range rec.Layers {
		l, _ := idx.layer(r)
		out.Layers = append(out.Layers, l)
	}
	return out, nil
}

func (idx index) hasAll(refs []string) bool {
	for _, r := range refs {
		if _, ok := idx.Layers[r]; !ok {
			return false
		}
	}
	return true
}

// openImage opens the image opts.Source names.
func openImage(ctx context.Context, opts ImportOptions) (v1.Image, error) {
	src := opts.Source
	platform := v1.Platform{OS: "linux", Architecture: "amd64"}
	switch {
	case strings.HasPrefix(src, SourceOCILayout):
		dir, want, _ := strings.Cut(strings.TrimPrefix(src, SourceOCILayout), ":")
		return layoutImage(dir, want, platform)
	case strings.HasPrefix(src, SourceDockerArchive):
		file, tagName, _ := strings.Cut(strings.TrimPrefix(src, SourceDockerArchive), ":")
		var tag *name.Tag
		if tagName != "" {
			t, err := name.NewTag(tagName)
			if err != nil {
				return nil, errdefs.InvalidArgument("source: tag %q: %v", tagName, err)
			}
			tag = &t
		}
		if _, err := os.Stat(file); err != nil {
			return nil, errdefs.InvalidArgument("source: %v", err)
		}
		img, err := tarball.ImageFromPath(file, tag)
		if err != nil {
			return nil, errdefs.InvalidArgument("source: docker archive %s: %v", file, err)
		}
		return img, nil
	default:
		var nameOpts []name.Option
		if opts.Insecure {
			nameOpts = append(nameOpts, name.Insecure)
		}
		ref, err := name.ParseReference(src, nameOpts...)
		if err != nil {
			return nil, errdefs.InvalidArgument("source: %q is not oci:DIR, docker-archive:FILE or a registry reference: %v", src, err)
		}
		img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithPlatform(platform),
			remote.WithAuthFromKeychain(authn.DefaultKeychain))
		if err != nil {
			return nil, errdefs.Unavailable("source: pull %s: %v", ref, err)
		}
		return img, nil
	}
}

// layoutImage picks one image of an OCI layout: the manifest whose
// ref.name annotation is want, or the only one; an index inside is
// resolved to platform.
func layoutImage(dir, want string, platform v1.Platform) (v1.Image, error) {
	ii, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, errdefs.InvalidArgument("source: OCI layout %s: %v", dir, err)
	}
	im, err := ii.IndexManifest()
	if err != nil {
		return nil, errdefs.InvalidArgument("source: OCI layout %s: index.json: %v", dir, err)
	}
	var picked []v1.Descriptor
	for _, d := range im.Manifests {
		if want == "" || d.Annotations["org.opencontainers.image.ref.name"] == want {
			picked = append(picked, d)
		}
	}
	if len(picked) != 1 {
		return nil, errdefs.InvalidArgument("source: OCI layout %s has %d images named %q (of %d): name one with oci:DIR:REF", dir, len(picked), want, len(im.Manifests))
	}
	d := picked[0]
	if d.MediaType.IsIndex() {
		child, err := ii.ImageIndex(d.Digest)
		if err != nil {
			return nil, errdefs.InvalidArgument("source: OCI layout %s: %v", dir, err)
		}
		cm, err := child.IndexManifest()
		if err != nil {
			return nil, errdefs.InvalidArgument("source: OCI layout %s: %v", dir, err)
		}
		found := false
		for _, m := range cm.Manifests {
			if m.Platform != nil && m.Platform.Satisfies(platform) {
				d, found = m, true
				break
			}
		}
		if !found {
			return nil, errdefs.InvalidArgument("source: OCI layout %s: no %s/%s image", dir, platform.OS, platform.Architecture)
		}
		ii = child
	}
	img, err := ii.Image(d.Digest)
	if err != nil {
		return nil, errdefs.InvalidArgument("source: OCI layout %s: image %s: %v", dir, d.Digest, err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		return nil, errdefs.InvalidArgument("source: OCI layout %s: manifest %s: %v", dir, d.Digest, err)
	}
	if got := sha256Hex(raw); got != d.Digest.String() {
		return nil, errdefs.InvalidArgument("source: OCI layout %s: manifest has digest %s, index.json says %s", dir, got, d.Digest)
	}
	return img, nil
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return digestAlgo + ":" + hex.EncodeToString(sum[:])
}

// convert makes (or finds) one EROFS layer per image layer.
func (s *Store) convert(ctx context.Context, img v1.Image, opts ImportOptions) (importRecord, []Layer, error) {
	m, err := img.Manifest()
	if err != nil {
		return importRecord{}, nil, errdefs.InvalidArgument("manifest: %v", err)
	}
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		return importRecord{}, nil, errdefs.InvalidArgument("config: %v", err)
	}
	if got := sha256Hex(rawCfg); m.Config.Digest.Hex != "" && got != m.Config.Digest.String() {
		return importRecord{}, nil, errdefs.InvalidArgument("config has digest %s, the manifest says %s", got, m.Config.Digest)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return importRecord{}, nil, errdefs.InvalidArgument("config: %v", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return importRecord{}, nil, errdefs.InvalidArgument("layers: %v", err)
	}
	if len(layers) == 0 || len(layers) > maxStack {
		return importRecord{}, nil, errdefs.InvalidArgument("image has %d layers, want 1 to %d", len(layers), maxStack)
	}
	if len(cfg.RootFS.DiffIDs) != len(layers) {
		return importRecord{}, nil, errdefs.InvalidArgument("config lists %d diff_ids for %d layers", len(cfg.RootFS.DiffIDs), len(layers))
	}
	rec := importRecord{Env: cfg.Config.Env}
	var made []Layer
	var read int64
	fail := func(err error) (importRecord, []Layer, error) {
		s.discard(made)
		return importRecord{}, nil, err
	}
	for i, layer := range layers {
		diffID := cfg.RootFS.DiffIDs[i]
		if !digestRE.MatchString(diffID.String()) {
			return fail(errdefs.InvalidArgument("layer %d: diff_id %q is not a sha256 digest", i+1, diffID))
		}
		ref := "oci-" + diffID.Hex[:32] + "@1"
		p := ImportProgress{Layer: i + 1, Layers: len(layers), Bytes: read}
		idx, err := s.readIndex()
		if err != nil {
			return fail(err)
		}
		if _, ok := idx.Layers[ref]; ok {
			p.Cached = true
			opts.Progress(p)
			rec.Layers = append(rec.Layers, ref)
			continue
		}
		opts.Progress(p)
		l, n, err := s.importLayer(ctx, ref, layer, diffID, func(n int64) {
			p.Bytes = read + n
			opts.Progress(p)
		})
		read += n
		if err != nil {
			return fail(fmt.Errorf("layer %d of %d (%s): %w", i+1, len(layers), diffID, err))
		}
		made = append(made, l)
		rec.Layers = append(rec.Layers, ref)
	}
	return rec, made, nil
}

// importLayer extracts one image layer, checks its diff_id and makes it an
// anonymous EROFS layer. It returns the uncompressed bytes read.
func (s *Store) importLayer(ctx context.Context, ref string, layer v1.Layer, diffID v1.Hash, progress func(int64)) (Layer, int64, error) {
	rc, err := layer.Uncompressed()
	if err != nil {
		return Layer{}, 0, errdefs.InvalidArgument("open: %v", err)
	}
	defer rc.Close()
	tmp, err := s.tarDir()
	if err != nil {
		return Layer{}, 0, err
	}
	defer os.RemoveAll(tmp)
	h := sha256.New()
	cr := &countingReader{r: rc, h: h, progress: progress}
	tarErr := untar(ctx, cr, tmp, true)
	// tar stops at the end-of-archive marker: the digest covers the rest.
	_, drainErr := io.Copy(io.Discard, cr)
	if got := digestAlgo + ":" + hex.EncodeToString(h.Sum(nil)); drainErr == nil && got != diffID.String() {
		return Layer{}, cr.n, errdefs.InvalidArgument("content has digest %s, the config's diff_id is %s (corrupt or truncated blob)", got, diffID)
	}
	if drainErr != nil {
		return Layer{}, cr.n, errdefs.InvalidArgument("read: %v (truncated or corrupt blob)", drainErr)
	}
	if tarErr != nil {
		return Layer{}, cr.n, tarErr
	}
	if err := convertWhiteouts(tmp); err != nil {
		return Layer{}, cr.n, err
	}
	l, err := s.createLayer(ctx, ref, tmp, false, mkfsOptions{})
	if err != nil {
		return Layer{}, cr.n, err
	}
	if err := s.markAnonymous(l.Ref); err != nil {
		s.discard([]Layer{l})
		return Layer{}, cr.n, err
	}
	return l, cr.n, nil
}

// markAnonymous records that ref is kept only by what uses it.
func (s *Store) markAnonymous(ref string) error {
	unlock, err := s.lockIndex()
	if err != nil {
		return err
	}
	defer unlock()
	idx, err := s.readIndex()
	if err != nil {
		return err
	}
	idx.Anonymous[ref] = true
	return s.writeIndex(idx)
}

// discard removes layers a failed import made.
func (s *Store) discard(layers []Layer) {
	if len(layers) == 0 {
		return
	}
	unlock, err := s.lockIndex()
	if err != nil {
		return
	}
	defer unlock()
	idx, err := s.readIndex()
	if err != nil {
		return
	}
	out := Removed{Layers: layers}
	for _, l := range layers {
		delete(idx.Layers, l.Ref)
		delete(idx.Anonymous, l.Ref)
		delete(idx.Latest, l.Name())
	}
	_ = s.dropUnnamed(&idx, &out) // best effort; GC removes what stays
	_ = s.writeIndex(idx)
}

// countingReader hashes and counts what it reads.
type countingReader struct {
	r        io.Reader
	h        hash.Hash
	n        int64
	progress func(int64)
	last     int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	if c.n-c.last >= 4<<20 || (err == io.EOF && c.n != c.last) {
		c.last = c.n
		c.progress(c.n)
	}
	return n, err
}

// untar extracts a tar stream into dir with GNU tar: numeric owners,
// modes and xattrs kept; GNU tar refuses members that climb out with ".."
// and defers symlinks that could redirect later members. Untrusted
// archives (imports) lose trusted.* xattrs, which would otherwise steer
// overlayfs (redirects, metacopy); their opaque directories come from OCI
// .wh..wh..opq markers instead.
func untar(ctx context.Context, r io.Reader, dir string, untrusted bool) error {
	args := []string{"-x", "-f", "-", "-C", dir, "--numeric-owner", "--same-owner",
		"--same-permissions", "--xattrs", "--xattrs-include=*"}
	if untrusted {
		args = append(args, "--xattrs-exclude=trusted.*")
	}
	cmd := exec.CommandContext(ctx, "tar", args...)
	cmd.Stdin = r
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errdefs.InvalidArgument("extract tar: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// tarDir makes a temporary directory to extract into.
func (s *Store) tarDir() (string, error) {
	tmp, err := os.MkdirTemp(s.layers, tmpPrefix+"tar-")
	if err != nil {
		return "", err
	}
	// The root's mode unless the tar has a "./" entry (MkdirTemp made it 0700).
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", errors.Join(err, os.RemoveAll(tmp))
	}
	return tmp, nil
}
