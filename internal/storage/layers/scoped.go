package layers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/corral-dev/corral/internal/backend"
)

// Mount scopes: by default a layer is mounted once per node and every
// sandbox shares that mount, and so its page cache (a sandbox can tell,
// with mincore or a read's time, whether a neighbour read a file of it).
// A scope is a set of sandboxes with mounts of their own: the same layer
// files mounted again at layers/sha256-<hex>.<scope>/, a superblock of
// their own and so page caches of their own. The node uses one scope per
// project in per-project mode. Scoped mounts stay, as shared ones do,
// until their layer goes.

// scopeRE is what MountScope returns: a dot cannot be in a digest, so a
// mount point names its digest and scope without ambiguity.
var scopeRE = regexp.MustCompile(`^p[0-9a-f]{16}$`)

// MountScope is the mount scope of the sandboxes of project ("" too: the
// node administrator's sandboxes are a scope of their own).
func MountScope(project string) string {
	h := sha256.Sum256([]byte("corral project " + project))
	return "p" + hex.EncodeToString(h[:8])
}

// AcquireIn is Acquire with the layers mounted in scope ("": the shared
// mounts).
func (s *Store) AcquireIn(ctx context.Context, name, holder, scope string) (Image, error) {
	if scope == "" {
		return s.Acquire(ctx, name, holder)
	}
	if !scopeRE.MatchString(scope) {
		return Image{}, fmt.Errorf("image %q: mount scope %q is not one of MountScope's", name, scope)
	}
	s.useMu.Lock()
	defer s.useMu.Unlock()
	img, err := s.resolve(ctx, name)
	if err != nil {
		return Image{}, err
	}
	img.Disks = make([]backend.LayerDisk, len(img.Stack))
	img.Layers = make([]string, len(img.Stack))
	for i, l := range img.Stack {
		mp := s.layerMount(l.Digest) + "." + scope
		disk, err := s.mountLayerAt(ctx, l, mp)
		if err != nil {
			return Image{}, fmt.Errorf("image %q: %w", img.Name, err)
		}
		img.Disks[len(img.Stack)-1-i] = disk // topmost first
		img.Layers[len(img.Stack)-1-i] = mp
	}
	s.pinLocked(holder, img.Stack)
	return img, nil
}

// scopedMounts returns digest's scoped mount points (directories there).
func (s *Store) scopedMounts(digest string) ([]string, error) {
	prefix := filepath.Base(s.layerMount(digest)) + "."
	ents, err := os.ReadDir(s.layers)
	if err != nil {
		return nil, fmt.Errorf("layer store: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
			out = append(out, filepath.Join(s.layers, e.Name()))
		}
	}
	return out, nil
}

// splitMountDir splits a mount point's name into its digest and scope
// (ok false for a name that is neither sha256-<hex> nor sha256-<hex>.<scope>).
func splitMountDir(name string) (digest, scope string, ok bool) {
	if !strings.HasPrefix(name, digestAlgo+"-") {
		return "", "", false
	}
	base, scope, scoped := strings.Cut(name, ".")
	if scoped && !scopeRE.MatchString(scope) {
		return "", "", false
	}
	digest = digestAlgo + ":" + strings.TrimPrefix(base, digestAlgo+"-")
	return digest, scope, digestRE.MatchString(digest)
}
