// Package image owns corral's read-only root filesystem images and the
// layers they are made of. A layer is an EROFS image file, content-
// addressed by its sha256 and named NAME@VERSION (layer.go), mounted
// file-backed once per node and shared by every sandbox (mount.go). An
// image is a composition: a name, a default environment and an ordered
// list of layers, base first, recorded in <dir>/<name>/image.json. The
// built-in recipes (busybox, debian) build a directory tree and turn it
// into one layer (build.go); a build never leaves a half image behind.
//
// The package may import internal/errdefs and internal/backend types only;
// nothing here knows about sandboxes, the node or the API.
package image

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
	if !nameRE.MatchString(name) || name == layersDir {
		return errdefs.InvalidArgument("name %q: must be 1-64 characters of a-z, 0-9, '.', '_', '-', starting with a letter or digit, not %q", name, layersDir)
	}
	return nil
}

// Store keeps images in a directory, one subdirectory per image. It is
// safe for concurrent use; builds of one name are serialized.
type Store struct {
	dir    string
	layers string // <dir>/layers

	mountMu sync.Mutex // serializes mounting layers

	mu       sync.Mutex
	building map[string]chan struct{} // closed when that name's build ends
}

// Open opens (creating it if needed) the image store in dir, removes what
// interrupted builds left there, and brings the layer mounts back to what
// an earlier run left: missing ones mounted again, stale ones removed.
// Close(true) unmounts them.
func Open(ctx context.Context, dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image store %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	s := &Store{dir: abs, layers: filepath.Join(abs, layersDir), building: map[string]chan struct{}{}}
	if err := os.MkdirAll(s.layers, 0o755); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	if err := s.sweep(ctx, s.dir); err != nil {
		return nil, err
	}
	if err := s.sweep(ctx, s.layers); err != nil {
		return nil, err
	}
	if err := s.reconcile(); err != nil {
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

// Get returns the image called name, its layers mounted.
func (s *Store) Get(ctx context.Context, name string) (Image, error) {
	if err := checkName(name); err != nil {
		return Image{}, err
	}
	img, err := s.load(name)
	if errors.Is(err, os.ErrNotExist) {
		return Image{}, s.notFound(ctx, name)
	}
	if err != nil {
		return Image{}, err
	}
	return img, s.mountImage(img)
}

// mountImage mounts the layers of img that are not mounted yet.
func (s *Store) mountImage(img Image) error {
	for _, l := range img.Stack {
		if err := s.mountLayer(l.Digest); err != nil {
			return fmt.Errorf("image %q: %w", img.Name, err)
		}
	}
	return nil
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
	return errdefs.NotFound("image %q not found (have: %s); buildable images: %s", name, have, recipeNames())
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
	img := Image{Name: name, Stack: m.Layers, Env: m.Env}
	for i := len(m.Layers) - 1; i >= 0; i-- {
		if !digestRE.MatchString(m.Layers[i].Digest) {
			return Image{}, fmt.Errorf("image %q: layer %s: bad digest %q", name, m.Layers[i].Ref, m.Layers[i].Digest)
		}
		img.Layers = append(img.Layers, s.layerMount(m.Layers[i].Digest))
		img.Disks = append(img.Disks, backend.LayerDisk{Image: s.layerFile(m.Layers[i].Digest)})
	}
	return img, nil
}

// List returns the store's images sorted by name (their layers are not
// mounted by List).
func (s *Store) List(ctx context.Context) ([]Image, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	var out []Image
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !e.IsDir() || checkName(e.Name()) != nil {
			continue
		}
		img, err := s.load(e.Name())
		if errors.Is(err, os.ErrNotExist) {
			continue // not an image
		}
		if err != nil {
			return nil, err
		}
		out = append(out, img)
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
			return img, s.mountImage(img)
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
	return img, s.mountImage(img)
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
