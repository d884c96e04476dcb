package control

import (
	"context"
	"fmt"
	"strings"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// ImageOwners records which project owns each image name (all versions of
// NAME@VERSION belong to the project that made NAME first), in the IAM
// store under images/NAME. A name without an owner was made by the node
// administrator (the built-in busybox and debian among them) and every
// project may use it. A project may use its own names, its ancestors' and
// its subprojects'; others' are NotFound. Names are one namespace per node:
// a name taken by another project is refused as taken. The layers an
// import makes (oci-<diff id>, shared by every import of that content) are
// reached by tokens only through the import's composition: listing or
// naming them directly could expose another project's private image.
type ImageOwners struct {
	Store iam.Store
	// Exists reports whether the node's image store has name (any
	// version, as an image, composition or layer).
	Exists func(ctx context.Context, name string) (bool, error)
}

func ownerKey(name string) string { return "images/" + name }

// importedLayerPrefix starts the names of layers made by imports.
const importedLayerPrefix = "oci-"

func imported(name string) bool { return strings.HasPrefix(name, importedLayerPrefix) }

// imageName is the name part of NAME@VERSION.
func imageName(ref string) string {
	name, _, _ := strings.Cut(ref, "@")
	return name
}

func (o *ImageOwners) owner(ctx context.Context, name string) (project string, rev int64, err error) {
	v, rev, err := o.Store.Get(ctx, ownerKey(name))
	if errdefs.IsNotFound(err) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("owner of image %s: %w", name, err)
	}
	return string(v), rev, nil
}

func shareKey(name, project string) string { return "imageshares/" + name + "/" + project }

// sharedWith reports whether name is shared with project or an ancestor.
func (o *ImageOwners) sharedWith(ctx context.Context, name, project string) (bool, error) {
	for _, anc := range iam.Ancestors(project) {
		_, _, err := o.Store.Get(ctx, shareKey(name, anc))
		if err == nil {
			return true, nil
		}
		if !errdefs.IsNotFound(err) {
			return false, err
		}
	}
	return false, nil
}

// Share lets project (and its subprojects) use ref's name, or stops that
// with unshare; p must be an admin of the name's owner.
func (o *ImageOwners) Share(ctx context.Context, p iam.Principal, ref, project string, unshare bool) error {
	name := imageName(ref)
	if name == "" {
		return errdefs.InvalidArgument("name: required")
	}
	if err := iam.ValidateProject(project); err != nil {
		return err
	}
	owner, _, err := o.owner(ctx, name)
	if err != nil {
		return err
	}
	switch {
	case owner == "" && (p.NodeAdmin || !imported(name)):
		if ok, err := o.Exists(ctx, name); err == nil && ok {
			return errdefs.InvalidArgument("image %s: belongs to the node administrator, so every project may use it already", name)
		}
		return errdefs.NotFound("image %s: not found", name)
	case owner == "" || !p.Sees(owner) && !p.NodeAdmin:
		return errdefs.NotFound("image %s: not found", name)
	case !p.Administers(owner):
		return errdefs.PermissionDenied("image %s: %s may not share it (needs the admin role in %s)", name, p, owner)
	}
	w := iam.Write{Key: shareKey(name, project), Value: []byte(p.String())}
	if unshare {
		w = iam.Write{Key: shareKey(name, project), Delete: true}
	}
	return o.Store.Txn(ctx, nil, []iam.Write{w})
}

// usable says whether p may use what owner owns.
func usable(p iam.Principal, owner string) bool {
	return p.NodeAdmin || owner == "" || p.Sees(owner) || iam.Within(p.Project, owner)
}

// ownerOf is the project owning ref's name; an imported layer's is none a
// caller may name (NotFound, with why).
func (o *ImageOwners) ownerOf(ctx context.Context, ref, why string) (string, error) {
	if imported(imageName(ref)) {
		return "", errdefs.NotFound("image %s: not found%s", ref, why)
	}
	owner, _, err := o.owner(ctx, imageName(ref))
	return owner, err
}

// CheckUse fails unless p may use image ref (as a sandbox's image or a
// composition's layer).
func (o *ImageOwners) CheckUse(ctx context.Context, p iam.Principal, ref string) error {
	if ref == "" || p.NodeAdmin {
		return nil
	}
	owner, err := o.ownerOf(ctx, ref, " (an import's layers are used through its composition)")
	if err != nil {
		return err
	}
	if !usable(p, owner) {
		if shared, err := o.sharedWith(ctx, imageName(ref), p.Project); err != nil || !shared {
			return errdefs.NotFound("image %s: not found", ref)
		}
	}
	return nil
}

// CheckOwn fails unless p may change or remove image ref.
func (o *ImageOwners) CheckOwn(ctx context.Context, p iam.Principal, ref string) error {
	if p.NodeAdmin {
		return nil
	}
	owner, err := o.ownerOf(ctx, ref, "")
	if err != nil {
		return err
	}
	if owner == "" {
		if ok, err := o.Exists(ctx, imageName(ref)); err != nil || ok {
			return errdefs.PermissionDenied("image %s: belongs to the node administrator (built-in or made on the node's socket)", ref)
		}
		return errdefs.NotFound("image %s: not found", ref)
	}
	if !p.Sees(owner) {
		return errdefs.NotFound("image %s: not found", ref)
	}
	return nil
}

// Claim makes p's project the owner of ref's name, or checks that it (or a
// project p sees) owns it already; it is called before the name is made.
func (o *ImageOwners) Claim(ctx context.Context, p iam.Principal, ref string) error {
	name := imageName(ref)
	if p.NodeAdmin || name == "" {
		return nil
	}
	if imported(name) {
		return errdefs.InvalidArgument("name %s: names starting with %s are kept for the layers imports make", ref, importedLayerPrefix)
	}
	for range 3 {
		owner, _, err := o.owner(ctx, name)
		if err != nil {
			return err
		}
		if owner != "" {
			if p.Sees(owner) {
				return nil
			}
			return errdefs.AlreadyExists("image name %s: taken by another project on this node; pick another name", name)
		}
		if ok, err := o.Exists(ctx, name); err != nil {
			return err
		} else if ok {
			return errdefs.PermissionDenied("image name %s: belongs to the node administrator; pick another name", name)
		}
		err = o.Store.Txn(ctx, []iam.Cond{{Key: ownerKey(name), Rev: 0}}, []iam.Write{{Key: ownerKey(name), Value: []byte(p.Project)}})
		if err == nil || !errdefs.IsFailedPrecondition(err) {
			return err
		}
	}
	return errdefs.Unavailable("image name %s: claimed concurrently; retry", name)
}

// Owned returns the names project owns (not its subprojects').
func (o *ImageOwners) Owned(ctx context.Context, project string) ([]string, error) {
	entries, err := o.Store.List(ctx, "images/")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if string(e.Value) == project {
			names = append(names, strings.TrimPrefix(e.Key, "images/"))
		}
	}
	return names, nil
}

// Forget drops the owner record and the shares of name.
func (o *ImageOwners) Forget(ctx context.Context, name string) error {
	shares, err := o.Store.List(ctx, "imageshares/"+name+"/")
	if err != nil {
		return err
	}
	writes := []iam.Write{{Key: ownerKey(name), Delete: true}}
	for _, e := range shares {
		writes = append(writes, iam.Write{Key: e.Key, Delete: true})
	}
	return o.Store.Txn(ctx, nil, writes)
}

// Filter keeps in r what p may use.
func (o *ImageOwners) Filter(ctx context.Context, p iam.Principal, r *corralv1.ListImagesResponse) {
	owners := map[string]string{}
	if entries, err := o.Store.List(ctx, "images/"); err == nil {
		for _, e := range entries {
			owners[strings.TrimPrefix(e.Key, "images/")] = string(e.Value)
		}
	} else {
		// Unknown owners: show only what nobody owns... which we cannot
		// tell either, so show nothing.
		r.Images, r.Compositions, r.Layers = nil, nil, nil
		return
	}
	shared := map[string]bool{} // names shared with p's project or an ancestor
	if entries, err := o.Store.List(ctx, "imageshares/"); err == nil {
		for _, e := range entries {
			name, project, _ := strings.Cut(strings.TrimPrefix(e.Key, "imageshares/"), "/")
			if iam.Within(p.Project, project) {
				shared[name] = true
			}
		}
	}
	keep := func(ref string) bool {
		name := imageName(ref)
		return !imported(name) && (usable(p, owners[name]) || shared[name])
	}
	var imgs []*corralv1.BuiltImage
	for _, i := range r.Images {
		if keep(i.Name) {
			imgs = append(imgs, i)
		}
	}
	var comps []*corralv1.Composition
	for _, c := range r.Compositions {
		if keep(c.Ref) {
			comps = append(comps, c)
		}
	}
	var layers []*corralv1.Layer
	for _, l := range r.Layers {
		if keep(l.Ref) {
			layers = append(layers, l)
		}
	}
	r.Images, r.Compositions, r.Layers = imgs, comps, layers
}
