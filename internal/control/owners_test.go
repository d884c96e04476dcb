package control

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// TestImageOwners: a project's image names are its own, its subprojects'
// and ancestors' to use and nobody else's; the node's names and imports'
// layers stay out of reach of tokens' claims.
func TestImageOwners(t *testing.T) {
	st, err := iam.OpenBolt(filepath.Join(t.TempDir(), "iam.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	nodeNames := map[string]bool{"busybox": true, "debian": true}
	o := &ImageOwners{Store: st, Exists: func(_ context.Context, name string) (bool, error) { return nodeNames[name], nil }}
	ctx := context.Background()
	a := iam.Principal{Project: "a", Role: iam.RoleMember, TokenID: "000000000001"}
	sub := iam.Principal{Project: "a/sub", Role: iam.RoleMember, TokenID: "000000000002"}
	b := iam.Principal{Project: "b", Role: iam.RoleAdmin, TokenID: "000000000003"}
	if err := o.Claim(ctx, a, "env@1"); err != nil {
		t.Fatal(err)
	}
	if err := o.Claim(ctx, a, "env@2"); err != nil {
		t.Errorf("a new version of a's own name: %v", err)
	}
	if err := o.Claim(ctx, b, "env@3"); !errdefs.IsAlreadyExists(err) {
		t.Errorf("b claims a's name: %v, want already exists", err)
	}
	if err := o.Claim(ctx, b, "debian@2"); !errdefs.IsPermissionDenied(err) {
		t.Errorf("b claims the node's name: %v, want permission denied", err)
	}
	if err := o.Claim(ctx, b, "oci-0123@1"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("b claims an import layer's name: %v, want invalid argument", err)
	}
	for _, tc := range []struct {
		who  iam.Principal
		ref  string
		want bool
	}{{a, "env@1", true}, {sub, "env", true}, {b, "env@1", false}, {b, "busybox@1", true}, {b, "oci-0123@1", false}} {
		if err := o.CheckUse(ctx, tc.who, tc.ref); (err == nil) != tc.want || (err != nil && !errdefs.IsNotFound(err)) {
			t.Errorf("%s uses %s: %v, want allowed=%v (else not found)", tc.who.Project, tc.ref, err, tc.want)
		}
	}
	if err := o.CheckOwn(ctx, b, "env@1"); !errdefs.IsNotFound(err) {
		t.Errorf("b removes a's image: %v, want not found", err)
	}
	if err := o.CheckOwn(ctx, b, "busybox@1"); !errdefs.IsPermissionDenied(err) {
		t.Errorf("b removes the node's image: %v, want permission denied", err)
	}
	aAdmin := iam.Principal{Project: "a", Role: iam.RoleAdmin, TokenID: "000000000004"}
	if err := o.Share(ctx, a, "env", "b", false); !errdefs.IsPermissionDenied(err) {
		t.Errorf("a member shares: %v, want permission denied", err)
	}
	if err := o.Share(ctx, b, "env", "b", false); !errdefs.IsNotFound(err) {
		t.Errorf("b shares a's name: %v, want not found", err)
	}
	if err := o.Share(ctx, aAdmin, "env@1", "b", false); err != nil {
		t.Fatal(err)
	}
	bsub := iam.Principal{Project: "b/sub", Role: iam.RoleMember, TokenID: "000000000005"}
	if err := o.CheckUse(ctx, bsub, "env@2"); err != nil {
		t.Errorf("b's subproject uses a shared name: %v", err)
	}
	if err := o.CheckOwn(ctx, b, "env@1"); !errdefs.IsNotFound(err) {
		t.Errorf("b removes a shared image: %v, want not found", err)
	}
	if err := o.Share(ctx, aAdmin, "env", "b", true); err != nil {
		t.Fatal(err)
	}
	if err := o.CheckUse(ctx, b, "env@1"); !errdefs.IsNotFound(err) {
		t.Errorf("b uses an unshared name: %v, want not found", err)
	}
	resp := &corralv1.ListImagesResponse{
		Images:       []*corralv1.BuiltImage{{Name: "busybox"}},
		Compositions: []*corralv1.Composition{{Ref: "env@1"}, {Ref: "imported@1"}},
		Layers:       []*corralv1.Layer{{Ref: "env@1"}, {Ref: "oci-0123@1"}, {Ref: "busybox@1"}},
	}
	o.Filter(ctx, b, resp)
	var refs []string
	for _, c := range resp.Compositions {
		refs = append(refs, c.Ref)
	}
	for _, l := range resp.Layers {
		refs = append(refs, l.Ref)
	}
	if !slices.Equal(refs, []string{"imported@1", "busybox@1"}) || len(resp.Images) != 1 {
		t.Errorf("b lists %v and %d images; want imported@1 busybox@1 and busybox", refs, len(resp.Images))
	}
}
