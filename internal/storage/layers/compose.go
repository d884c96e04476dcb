package layers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Composition is a named, versioned environment: an ordered list of layer
// references, base first (base OS, workspace, toolkits). A reference is
// NAME@VERSION (pinned) or NAME, which follows NAME's latest version: a
// toolkit upgrade then is one new layer version, whatever the number of
// compositions that use it. Compositions are immutable, one file each
// under compositions/.
type Composition struct {
	// Ref is NAME@VERSION.
	Ref string `json:"ref"`
	// Layers are layer references, base first.
	Layers []string `json:"layers"`
	// Env is the default environment ("KEY=VALUE").
	Env []string `json:"env,omitempty"`
}

const (
	compositionsDir = "compositions"
	compositionExt  = ".json"
	// maxStack bounds a composition's layers (overlayfs takes up to 500
	// lower layers; far fewer keeps mount options short).
	maxStack = 64
)

// defaultEnv is the environment of a composition or layer that names none.
var defaultEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

func (s *Store) compositionFile(ref string) string {
	return filepath.Join(s.dir, compositionsDir, ref+compositionExt)
}

// checkLayerRef validates a layer reference of a composition: NAME@VERSION
// or NAME.
func checkLayerRef(field, ref string) error {
	if strings.Contains(ref, "@") {
		if err := checkRef(ref); err != nil {
			return errdefs.InvalidArgument("%s: %q must be NAME@VERSION or NAME", field, ref)
		}
		return nil
	}
	if !nameRE.MatchString(ref) {
		return errdefs.InvalidArgument("%s: %q must be NAME@VERSION or NAME", field, ref)
	}
	return nil
}

// CreateComposition records the composition c after checking that each of
// its layers exists. Like layer versions, compositions are immutable:
// recording an existing ref with other layers fails (AlreadyExists), with
// the same ones returns the existing composition.
func (s *Store) CreateComposition(ctx context.Context, c Composition) (Composition, error) {
	if err := checkRef(c.Ref); err != nil {
		return Composition{}, err
	}
	if len(c.Layers) == 0 || len(c.Layers) > maxStack {
		return Composition{}, errdefs.InvalidArgument("layers: %d given, want 1 to %d", len(c.Layers), maxStack)
	}
	if len(c.Env) == 0 {
		c.Env = defaultEnv
	}
	idx, err := s.readIndex()
	if err != nil {
		return Composition{}, err
	}
	for i, ref := range c.Layers {
		field := fmt.Sprintf("layers[%d]", i)
		if err := checkLayerRef(field, ref); err != nil {
			return Composition{}, err
		}
		if _, err := idx.resolveLayer(ref); err != nil {
			return Composition{}, fmt.Errorf("%s: %w", field, err)
		}
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return Composition{}, err
	}
	dst := s.compositionFile(c.Ref)
	if old, err := s.composition(c.Ref); err == nil {
		if slices.Equal(old.Layers, c.Layers) && slices.Equal(old.Env, c.Env) {
			return old, ctx.Err()
		}
		return Composition{}, errdefs.AlreadyExists("name: composition %s exists with layers %s (compositions are immutable: pick a new version)", c.Ref, strings.Join(old.Layers, ", "))
	}
	f, err := os.CreateTemp(filepath.Dir(dst), tmpPrefix)
	if err != nil {
		return Composition{}, fmt.Errorf("composition %s: %w", c.Ref, err)
	}
	defer os.Remove(f.Name()) // fails harmlessly after the rename
	_, err = f.Write(append(b, '\n'))
	err = errors.Join(err, f.Chmod(0o644), f.Close())
	if err != nil {
		return Composition{}, fmt.Errorf("composition %s: %w", c.Ref, err)
	}
	// NOREPLACE: a concurrent create of the same ref loses cleanly.
	err = unix.Renameat2(unix.AT_FDCWD, f.Name(), unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
	if err == unix.EEXIST {
		return Composition{}, errdefs.AlreadyExists("name: composition %s exists", c.Ref)
	}
	if err != nil {
		return Composition{}, fmt.Errorf("composition %s: %w", c.Ref, err)
	}
	return c, nil
}

// composition reads one composition; a missing one is an os.ErrNotExist.
func (s *Store) composition(ref string) (Composition, error) {
	b, err := os.ReadFile(s.compositionFile(ref))
	if err != nil {
		return Composition{}, fmt.Errorf("composition %s: %w", ref, err)
	}
	var c Composition
	if err := json.Unmarshal(b, &c); err != nil {
		return Composition{}, fmt.Errorf("composition %s: %w", ref, err)
	}
	return c, nil
}

// Compositions returns every composition sorted by reference.
func (s *Store) Compositions(ctx context.Context) ([]Composition, error) {
	out, err := loadEach(ctx, filepath.Join(s.dir, compositionsDir), "compositions", func(e os.DirEntry) (string, bool) {
		ref, ok := strings.CutSuffix(e.Name(), compositionExt)
		return ref, ok && checkRef(ref) == nil // else a temporary file
	}, s.composition)
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref < out[j].Ref })
	return out, nil
}

// resolveLayer finds the layer ref names: NAME@VERSION, or NAME's latest
// version.
func (idx index) resolveLayer(ref string) (Layer, error) {
	if !strings.Contains(ref, "@") {
		v, ok := idx.latest(ref)
		if !ok {
			return Layer{}, errdefs.NotFound("layer %s not found", ref)
		}
		ref += "@" + v
	}
	l, ok := idx.layer(ref)
	if !ok {
		return Layer{}, errdefs.NotFound("layer %s not found", ref)
	}
	return l, nil
}

// stack resolves a composition's layers, base first.
func (idx index) stack(c Composition) ([]Layer, error) {
	out := make([]Layer, 0, len(c.Layers))
	for _, ref := range c.Layers {
		l, err := idx.resolveLayer(ref)
		if err != nil {
			return nil, fmt.Errorf("composition %s: %w", c.Ref, err)
		}
		out = append(out, l)
	}
	return out, nil
}

// resolve finds the image name names (see Get), without mounting it.
func (s *Store) resolve(ctx context.Context, name string) (Image, error) {
	versioned := strings.Contains(name, "@")
	if versioned {
		if err := checkRef(name); err != nil {
			return Image{}, errdefs.InvalidArgument("image: %q must be NAME or NAME@VERSION", name)
		}
	} else if err := checkName(name); err != nil {
		return Image{}, err
	}
	if !versioned {
		img, err := s.load(name)
		if err == nil || !errors.Is(err, os.ErrNotExist) {
			return img, err
		}
	}
	idx, err := s.readIndex()
	if err != nil {
		return Image{}, err
	}
	if versioned {
		c, err := s.composition(name)
		if err == nil {
			stack, err := idx.stack(c)
			if err != nil {
				return Image{}, err
			}
			return s.image(name, c.Env, stack), nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return Image{}, err
		}
	}
	if l, err := idx.resolveLayer(name); err == nil {
		return s.image(name, defaultEnv, []Layer{l}), nil
	}
	return Image{}, s.notFound(ctx, name)
}
