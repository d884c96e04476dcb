package layers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Layers in use are never deleted. Uses are of two kinds: holders (a
// sandbox, a pool) pin the digests of the image they were made from, in
// memory, for as long as they live (the node pins its sandboxes again from
// their records after a restart); compositions, built images and each
// name's latest version keep the layers they name. Remove refuses to
// delete a used layer; GC deletes every layer nothing uses.

// Acquire resolves and mounts the image name names, like Get, and pins its
// layers for holder (a sandbox id) until Release(holder). Resolving and
// pinning happen under the lock Remove and GC take, so a layer cannot go
// between the two.
func (s *Store) Acquire(ctx context.Context, name, holder string) (Image, error) {
	s.useMu.Lock()
	defer s.useMu.Unlock()
	img, err := s.Get(ctx, name)
	if err != nil {
		return Image{}, err
	}
	s.pinLocked(holder, img.Stack)
	return img, nil
}

// Pin pins stack's layers for holder, as Acquire does: for holders that
// outlived a daemon restart.
func (s *Store) Pin(holder string, stack []Layer) {
	s.useMu.Lock()
	defer s.useMu.Unlock()
	s.pinLocked(holder, stack)
}

func (s *Store) pinLocked(holder string, stack []Layer) {
	set := map[string]bool{}
	for _, l := range stack {
		set[l.Digest] = true
	}
	s.pins[holder] = set
}

// Release drops holder's pins.
func (s *Store) Release(holder string) {
	s.useMu.Lock()
	defer s.useMu.Unlock()
	delete(s.pins, holder)
}

// users maps each used digest to who uses it: holders, compositions,
// built images and the refs that are their name's latest version.
func (s *Store) users(ctx context.Context, idx index) (map[string][]string, error) {
	uses := map[string][]string{}
	for holder, set := range s.pins {
		for d := range set {
			uses[d] = append(uses[d], "sandbox "+holder)
		}
	}
	comps, err := s.Compositions(ctx)
	if err != nil {
		return nil, err
	}
	for _, c := range comps {
		for _, ref := range c.Layers {
			if l, err := idx.resolveLayer(ref); err == nil {
				uses[l.Digest] = append(uses[l.Digest], "composition "+c.Ref)
			}
		}
	}
	imgs, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, img := range imgs {
		for _, l := range img.Stack {
			uses[l.Digest] = append(uses[l.Digest], "image "+img.Name)
		}
	}
	for name, v := range idx.latestAll() {
		if d, ok := idx.Layers[name+"@"+v]; ok && !idx.Anonymous[name+"@"+v] {
			uses[d] = append(uses[d], "latest "+name+"@"+v)
		}
	}
	for d := range uses {
		sort.Strings(uses[d])
		uses[d] = slices.Compact(uses[d])
	}
	return uses, nil
}

// latestAll returns each layer name's latest version.
func (idx index) latestAll() map[string]string {
	out := map[string]string{}
	for ref := range idx.Layers {
		name, _, _ := strings.Cut(ref, "@")
		if _, ok := out[name]; !ok {
			out[name], _ = idx.latest(name)
		}
	}
	return out
}

// Removed says what Remove or GC deleted.
type Removed struct {
	// Compositions and Images are the references removed.
	Compositions []string
	Images       []string
	// Layers are the layers whose reference was removed; Deleted are
	// the digests whose files went (no reference named them any more).
	Layers  []Layer
	Deleted []string
	// FreedBytes is the size of the deleted metadata and blob files.
	FreedBytes int64
}

// Remove deletes ref: a built image NAME, or NAME@VERSION, which is a
// composition and/or a layer (pack records both under one name); both
// go. A layer still used by a sandbox or by another composition or image
// is kept and the call fails (FailedPrecondition, naming its users)
// before anything is removed. The layer's files go once no reference
// names its digest.
func (s *Store) Remove(ctx context.Context, ref string) (Removed, error) {
	if !strings.Contains(ref, "@") {
		if err := checkName(ref); err != nil {
			return Removed{}, err
		}
		return s.removeImage(ref)
	}
	if err := checkRef(ref); err != nil {
		return Removed{}, err
	}
	idx, unlock, err := s.lockedForRemoval()
	if err != nil {
		return Removed{}, err
	}
	defer unlock()
	_, compErr := s.composition(ref)
	hasComp := compErr == nil
	if compErr != nil && !errors.Is(compErr, os.ErrNotExist) {
		return Removed{}, compErr
	}
	l, hasLayer := idx.layer(ref)
	if !hasComp && !hasLayer {
		return Removed{}, errdefs.NotFound("%s: no composition or layer of that name", ref)
	}
	// Check first, so that a refusal removes nothing: the composition of
	// the same name does not count as a user of the layer.
	if hasLayer && len(idx.refsOf(l.Digest)) == 1 {
		uses, err := s.users(ctx, idx)
		if err != nil {
			return Removed{}, err
		}
		u := slices.DeleteFunc(uses[l.Digest], func(u string) bool {
			return u == "latest "+ref || u == "composition "+ref
		})
		if len(u) > 0 {
			return Removed{}, errdefs.FailedPrecondition("layer %s (%s) is in use by %s", ref, l.Digest, strings.Join(u, ", "))
		}
	}
	var out Removed
	if hasComp {
		if err := os.Remove(s.compositionFile(ref)); err != nil {
			return Removed{}, fmt.Errorf("remove composition %s: %w", ref, err)
		}
		out.Compositions = []string{ref}
	}
	if !hasLayer {
		return out, nil
	}
	delete(idx.Layers, ref)
	delete(idx.Anonymous, ref)
	if idx.Latest[l.Name()] == l.Version() {
		delete(idx.Latest, l.Name()) // the greatest remaining version stands in
	}
	out.Layers = []Layer{l}
	if err := s.dropUnnamed(&idx, &out); err != nil {
		return out, err
	}
	return out, s.writeIndex(idx)
}

// removeImage removes a built image's composition; its layers stay until
// removed or collected.
func (s *Store) removeImage(name string) (Removed, error) {
	unlock, err := s.lock(context.Background(), name)
	if err != nil {
		return Removed{}, err
	}
	defer unlock()
	if _, err := s.load(name); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Removed{}, errdefs.NotFound("image %q not found", name)
		}
		return Removed{}, err
	}
	if err := os.RemoveAll(filepath.Join(s.dir, name)); err != nil {
		return Removed{}, fmt.Errorf("remove image %q: %w", name, err)
	}
	return Removed{Images: []string{name}}, nil
}

// refsOf returns the references naming digest.
func (idx index) refsOf(digest string) []string {
	var out []string
	for ref, d := range idx.Layers {
		if d == digest {
			out = append(out, ref)
		}
	}
	return out
}

// lockedForRemoval takes the pinning lock, then the index, as Remove and GC
// do; unlock releases both.
func (s *Store) lockedForRemoval() (idx index, unlock func(), err error) {
	s.useMu.Lock()
	idx, unlockIndex, err := s.lockedIndex()
	if err != nil {
		s.useMu.Unlock()
		return idx, nil, err
	}
	return idx, func() { unlockIndex(); s.useMu.Unlock() }, nil
}

// GC deletes every layer that no sandbox, composition or built image uses
// and that is not its name's latest version, then every file of the store
// that no reference names (blobs of deleted layers, leftovers of an
// earlier crash).
func (s *Store) GC(ctx context.Context) (Removed, error) {
	idx, unlock, err := s.lockedForRemoval()
	if err != nil {
		return Removed{}, err
	}
	defer unlock()
	uses, err := s.users(ctx, idx)
	if err != nil {
		return Removed{}, err
	}
	var out Removed
	refs := make([]string, 0, len(idx.Layers))
	for ref := range idx.Layers {
		refs = append(refs, ref)
	}
	sort.Strings(refs)
	for _, ref := range refs {
		if d := idx.Layers[ref]; len(uses[d]) == 0 {
			out.Layers = append(out.Layers, idx.describe(ref, d))
			delete(idx.Layers, ref)
			delete(idx.Anonymous, ref)
		}
	}
	if err := s.dropUnnamed(&idx, &out); err != nil {
		return out, err
	}
	for d, rec := range idx.Imports {
		if !idx.hasAll(rec.Layers) {
			delete(idx.Imports, d) // the next import converts again
		}
	}
	named := map[string]bool{}
	for _, d := range idx.Layers {
		named[d] = true
	}
	for d := range idx.Digests {
		if !named[d] && len(uses[d]) == 0 {
			delete(idx.Digests, d) // replaced by a rebuild; removeStray deletes its files
		}
	}
	if err := s.writeIndex(idx); err != nil {
		return out, err
	}
	return out, s.removeStray(ctx, idx, uses, &out)
}

// dropUnnamed unmounts and deletes the files of every digest no reference
// names any more, and blobs no digest uses.
func (s *Store) dropUnnamed(idx *index, out *Removed) error {
	named := map[string]bool{}
	for _, d := range idx.Layers {
		named[d] = true
	}
	var errs []error
	for _, l := range out.Layers {
		if named[l.Digest] || slices.Contains(out.Deleted, l.Digest) {
			continue
		}
		errs = append(errs, s.unmountLayer(l.Digest))
		out.FreedBytes += l.MetaSize
		errs = append(errs, removeFile(s.metaFile(l.Digest)))
		delete(idx.Digests, l.Digest)
		out.Deleted = append(out.Deleted, l.Digest)
		if l.Split() && !idx.blobUsed(l.BlobDigest) {
			out.FreedBytes += l.BlobSize
			errs = append(errs, removeFile(s.blobFile(l.BlobDigest)))
		}
	}
	return errors.Join(errs...)
}

func (idx index) blobUsed(blob string) bool {
	for _, f := range idx.Digests {
		if f.BlobDigest == blob {
			return true
		}
	}
	return false
}

// removeStray deletes metadata files and blobs that the index does not
// name: what a crash between writing files and the index left, and
// digests a rebuild replaced, unless a holder still uses them.
func (s *Store) removeStray(ctx context.Context, idx index, uses map[string][]string, out *Removed) error {
	keep := map[string]bool{}
	for d := range uses {
		keep[s.metaFile(d)] = true
		if f, ok := idx.Digests[d]; ok {
			keep[s.blobFile(f.BlobDigest)] = true
		}
	}
	for _, d := range idx.Layers {
		keep[s.metaFile(d)] = true
		if f, ok := idx.Digests[d]; ok {
			keep[s.blobFile(f.BlobDigest)] = true
		}
	}
	var errs []error
	for _, dir := range []string{s.layers, s.blobs} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := ctx.Err(); err != nil {
				return err
			}
			p := filepath.Join(dir, e.Name())
			ext := filepath.Ext(p)
			if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), digestAlgo+"-") || (ext != layerExt && ext != blobExt) || keep[p] {
				continue
			}
			if info, err := e.Info(); err == nil {
				out.FreedBytes += info.Size()
			}
			if ext == layerExt {
				d := digestAlgo + ":" + strings.TrimSuffix(strings.TrimPrefix(e.Name(), digestAlgo+"-"), layerExt)
				errs = append(errs, s.unmountLayer(d))
				out.Deleted = append(out.Deleted, d)
			}
			errs = append(errs, removeFile(p))
		}
	}
	return errors.Join(errs...)
}

func removeFile(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
