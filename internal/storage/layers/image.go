// Package layers owns corral's read-only root filesystems. A layer is an
// EROFS image split into local metadata and a chunked data blob, content-
// addressed and named NAME@VERSION (layer.go), mounted file-backed once per
// node with its blob from a BlobSource (blob.go, mount.go) and shared by
// every sandbox. A composition stacks layers into an environment
// (compose.go); a built image is a recipe's composition with a name of its
// own (busybox, debian: build.go), recorded in <dir>/<name>/image.json.
// Imports turn OCI images into compositions (oci.go); pack turns a
// sandbox's upper directory into a layer (pack.go). Layers in use by a
// sandbox, a composition or an image are never deleted; GC removes the
// rest (refs.go). Nothing here leaves a half-made layer behind.
//
// It imports errdefs, blob, mountinfo and the backend package's types
// (LayerDisk); never a backend implementation, the node or the API
// (internal/deptest): nothing here knows about sandboxes.
package layers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// Image is a named, read-only root filesystem made of layers.
type Image struct {
	Name string
	// Stack is the composition, the base layer first (Docker order).
	Stack []Layer
	// Layers are the mounted Stack as host directories, the topmost first
	// (overlay lowerdir order). Get mounts them; nothing may write to them.
	Layers []string
	// Disks are the same layers as files, topmost first, for VM backends
	// that attach them to a guest as read-only block devices.
	Disks []backend.LayerDisk
	// Env is the default environment ("KEY=VALUE"), e.g. PATH.
	Env []string
}

// meta is what image.json records: the composition, base layer first. An
// image.json without layers is a directory image of an earlier version,
// which is rebuilt.
type meta struct {
	Name   string   `json:"name"`
	Recipe string   `json:"recipe"`
	Env    []string `json:"env"`
	Layers []Layer  `json:"layers"`
}

const (
	metaFile  = "image.json"
	tmpPrefix = ".tmp-" // builds in progress, and replaced images on the way out
)

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// checkName validates an image name (field "name").
func checkName(name string) error {
	if !nameRE.MatchString(name) || name == layersDir || name == blobsDir || name == compositionsDir {
		return errdefs.InvalidArgument("name %q: must be 1-64 characters of a-z, 0-9, '.', '_', '-', starting with a letter or digit, not %s, %s or %s", name, layersDir, blobsDir, compositionsDir)
	}
	return nil
}

// Store keeps images in a directory, one subdirectory per image. It is
// safe for concurrent use; builds of one name are serialized.
type Store struct {
	dir     string
	layers  string // <dir>/layers: metadata files, mount points, index
	blobs   string // <dir>/blobs: data blobs
	blobSrc BlobSource
	publish Publisher // nil: layers stay on this node

	warmBudget int64 // bytes of a new layer mount read into the page cache

	mountMu sync.Mutex // serializes mounting layers

	useMu sync.Mutex                 // serializes pinning with Remove and GC
	pins  map[string]map[string]bool // holder -> digests it uses

	mu       sync.Mutex
	building map[string]chan struct{} // closed when that name's build ends
}

// Open opens (creating it if needed) the image store in dir, removes what
// interrupted builds left there, and brings the layer mounts back to what
// an earlier run left: missing ones mounted again, stale ones removed.
// Close(true) unmounts them.
func Open(ctx context.Context, dir string, opts ...Option) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image store %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	s := &Store{dir: abs, layers: filepath.Join(abs, layersDir), blobs: filepath.Join(abs, blobsDir),
		building: map[string]chan struct{}{}, pins: map[string]map[string]bool{}, warmBudget: DefaultWarmBudget}
	s.blobSrc = LocalBlobs(s.blobs)
	for _, o := range opts {
		o(s)
	}
	for _, d := range []string{s.layers, s.blobs, filepath.Join(abs, compositionsDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	if err := s.sweep(ctx, s.dir); err != nil {
		return nil, err
	}
	for _, d := range []string{s.layers, s.blobs} {
		if err := s.sweep(ctx, d); err != nil {
			return nil, err
		}
	}
	if err := s.reconcile(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// sweep removes leftovers of builds interrupted by a crash.
func (s *Store) sweep(ctx context.Context, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("image store: remove leftover build: %w", err)
			}
		}
	}
	return nil
}

// Get returns the image name names, its layers mounted: a built image
// (busybox, debian), a composition NAME@VERSION, or a layer NAME@VERSION
// or NAME (its latest version) as an image of its own.
func (s *Store) Get(ctx context.Context, name string) (Image, error) {
	img, err := s.resolve(ctx, name)
	if err != nil {
		return Image{}, err
	}
	return s.mountImage(ctx, img)
}

// mountImage mounts the layers of img that are not mounted yet and fills
// in img.Disks.
func (s *Store) mountImage(ctx context.Context, img Image) (Image, error) {
	img.Disks = make([]backend.LayerDisk, len(img.Stack))
	for i, l := range img.Stack {
		disk, err := s.mountLayer(ctx, l)
		if err != nil {
			return Image{}, fmt.Errorf("image %q: %w", img.Name, err)
		}
		img.Disks[len(img.Stack)-1-i] = disk // topmost first, as Layers
	}
	return img, nil
}

// notFound says which images exist and how to build the missing one.
func (s *Store) notFound(ctx context.Context, name string) error {
	have := "none"
	if imgs, err := s.List(ctx); err == nil && len(imgs) > 0 {
		names := make([]string, len(imgs))
		for i, img := range imgs {
			names[i] = img.Name
		}
		have = strings.Join(names, ", ")
	}
	if _, ok := recipes[name]; ok {
		return errdefs.NotFound("image %q not found (have: %s); build it with `corral image build %s`", name, have, name)
	}
	return errdefs.NotFound("image %q not found: no built image, composition or layer of that name (built images: %s; buildable: %s; see `corral image ls`)", name, have, recipeNames())
}

// load reads one image's metadata; a missing image is an os.ErrNotExist.
func (s *Store) load(name string) (Image, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, name, metaFile))
	if err != nil {
		return Image{}, fmt.Errorf("image %q: %w", name, err)
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Image{}, fmt.Errorf("image %q: %s: %w", name, metaFile, err)
	}
	if len(m.Layers) == 0 { // a directory image of an earlier version
		return Image{}, fmt.Errorf("image %q: no layers (built by an earlier version): %w", name, os.ErrNotExist)
	}
	idx, err := s.readIndex()
	if err != nil {
		return Image{}, err
	}
	for i, l := range m.Layers {
		if !digestRE.MatchString(l.Digest) {
			return Image{}, fmt.Errorf("image %q: layer %s: bad digest %q", name, l.Ref, l.Digest)
		}
		if !l.Split() { // image.json of an earlier version lacks the blob
			m.Layers[i] = idx.describe(l.Ref, l.Digest)
		}
	}
	return s.image(name, m.Env, m.Layers), nil
}

// image makes an Image of a stack, base first.
func (s *Store) image(name string, env []string, stack []Layer) Image {
	img := Image{Name: name, Stack: stack, Env: env}
	for i := len(stack) - 1; i >= 0; i-- {
		img.Layers = append(img.Layers, s.layerMount(stack[i].Digest))
	}
	return img
}

// loadEach loads each entry of dir that pick names; one that is gone by
// then (removed meanwhile, or not one of them) is passed over.
func loadEach[T any](ctx context.Context, dir, what string, pick func(os.DirEntry) (string, bool), load func(name string) (T, error)) ([]T, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var out []T
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		name, ok := pick(e)
		if !ok {
			continue
		}
		v, err := load(name)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// List returns the store's images sorted by name (their layers are not
// mounted by List).
func (s *Store) List(ctx context.Context) ([]Image, error) {
	out, err := loadEach(ctx, s.dir, "image store", func(e os.DirEntry) (string, bool) {
		return e.Name(), e.IsDir() && checkName(e.Name()) == nil
	}, s.load)
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Build makes the image name from its built-in recipe, streaming the
// recipe's output to progress (which may be nil). An image that already
// exists is returned unchanged.
func (s *Store) Build(ctx context.Context, name string, progress io.Writer) (Image, error) {
	return s.build(ctx, name, progress, false)
}

// Rebuild makes the image name afresh and swaps it in atomically for the
// old one, which is deleted: only rebuild an image no sandbox uses.
func (s *Store) Rebuild(ctx context.Context, name string, progress io.Writer) (Image, error) {
	return s.build(ctx, name, progress, true)
}

func (s *Store) build(ctx context.Context, name string, progress io.Writer, force bool) (Image, error) {
	if err := checkName(name); err != nil {
		return Image{}, err
	}
	r, ok := recipes[name]
	if !ok {
		return Image{}, errdefs.NotFound("image %q: no recipe to build it (buildable images: %s)", name, recipeNames())
	}
	if progress == nil {
		progress = io.Discard
	}
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	if !force {
		img, err := s.load(name)
		if err == nil {
			return s.mountImage(ctx, img)
		}
		if !errors.Is(err, os.ErrNotExist) {
			return img, err
		}
	}
	if err := s.make(ctx, name, r, progress); err != nil {
		return Image{}, fmt.Errorf("build image %q: %w", name, err)
	}
	img, err := s.load(name)
	if err != nil {
		return Image{}, err
	}
	return s.mountImage(ctx, img)
}

// lock serializes builds of one name.
func (s *Store) lock(ctx context.Context, name string) (func(), error) {
	for {
		s.mu.Lock()
		done, busy := s.building[name]
		if !busy {
			done = make(chan struct{})
			s.building[name] = done
			s.mu.Unlock()
			return func() {
				s.mu.Lock()
				delete(s.building, name)
				s.mu.Unlock()
				close(done)
			}, nil
		}
		s.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, fmt.Errorf("image %q: wait for another build: %w", name, ctx.Err())
		}
	}
}
