// Package iam owns who may do what on corral: the authenticated caller of a
// request (a Principal carried in its context), projects and their nested
// quotas, tokens, and the Store their records live in (bbolt on a single
// node, etcd in a cluster). It may import errdefs, boltfile and the store
// libraries; it must not import the API, control, node or server packages.
package iam

import "context"

// Role is what a token's holder may do inside its project.
type Role string

const (
	// RoleAdmin manages the project: subprojects, quotas, tokens, and
	// everything a member may do.
	RoleAdmin Role = "admin"
	// RoleMember creates and drives sandboxes, images and calls.
	RoleMember Role = "member"
	// RoleViewer reads only.
	RoleViewer Role = "viewer"
)

// Principal is the authenticated caller of one request.
type Principal struct {
	// NodeAdmin is the node administrator: root on the node's unix
	// socket. It sees every project and alone may name node paths (under
	// --import-root).
	NodeAdmin bool
	// Project is the project the caller acts in, a slash-separated path
	// ("job42/agent7").
	Project string
	// Role is the caller's role in Project.
	Role Role
	// TokenID names the token used (never its secret); empty for the node
	// administrator. Audit entries carry it.
	TokenID string
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal of ctx; ok is false when the request
// was not authenticated.
func FromContext(ctx context.Context) (p Principal, ok bool) {
	p, ok = ctx.Value(principalKey{}).(Principal)
	return p, ok
}
