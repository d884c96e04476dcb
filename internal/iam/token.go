package iam

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Token is a bearer token's record. The secret itself is never stored:
// only its SHA-256 (a 256-bit random secret needs no slow hash).
type Token struct {
	ID          string    `json:"id"`
	Project     string    `json:"project"`
	Role        Role      `json:"role"`
	Description string    `json:"description,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	// ExpiresAt is zero for a token that does not expire.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	CreatedBy string    `json:"created_by,omitempty"`
	Hash      string    `json:"hash"`
}

// tokenPrefix starts every secret, so that scanners and people recognise one.
const tokenPrefix = "corral_"

var tokenIDPattern = regexp.MustCompile(`^[0-9a-f]{12}$`)

func tokenKey(id string) string { return "tokens/" + id }

func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// ParseRole checks a role name.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case RoleAdmin, RoleMember, RoleViewer:
		return r, nil
	}
	return "", errdefs.InvalidArgument("role: %q is not a role (admin, member, viewer)", s)
}

// CreateToken makes a token of project with role; ttl 0 never expires.
// The secret is returned once and cannot be read again.
func (s *Service) CreateToken(ctx context.Context, p Principal, project string, role Role, ttl time.Duration, description string) (*Token, string, error) {
	if err := ValidateProject(project); err != nil {
		return nil, "", err
	}
	if _, err := ParseRole(string(role)); err != nil {
		return nil, "", err
	}
	if ttl < 0 {
		return nil, "", errdefs.InvalidArgument("ttl: %s must not be negative (0: never expires)", ttl)
	}
	if len(description) > 200 {
		return nil, "", errdefs.InvalidArgument("description: %d characters is longer than 200", len(description))
	}
	if !p.Administers(project) {
		if p.Sees(project) {
			return nil, "", errdefs.PermissionDenied("token for project %s: %s may not create tokens (needs the admin role)", project, p)
		}
		return nil, "", errdefs.NotFound("project %s: not found", project)
	}
	if _, _, err := s.getProject(ctx, project); err != nil {
		return nil, "", err
	}
	idb := make([]byte, 6)
	sec := make([]byte, 32)
	if _, err := rand.Read(idb); err != nil {
		return nil, "", err
	}
	if _, err := rand.Read(sec); err != nil {
		return nil, "", err
	}
	id := hex.EncodeToString(idb)
	secret := tokenPrefix + id + "_" + base64.RawURLEncoding.EncodeToString(sec)
	now := s.now().UTC()
	t := &Token{ID: id, Project: project, Role: role, Description: description,
		CreatedAt: now, CreatedBy: p.String(), Hash: hashSecret(secret)}
	if ttl > 0 {
		t.ExpiresAt = now.Add(ttl)
	}
	val, _ := json.Marshal(t)
	if err := s.store.Txn(ctx, []Cond{{Key: tokenKey(id), Rev: 0}}, []Write{{Key: tokenKey(id), Value: val}}); err != nil {
		return nil, "", fmt.Errorf("create token: %w", err)
	}
	return t, secret, nil
}

func (s *Service) getToken(ctx context.Context, id string) (*Token, int64, error) {
	v, rev, err := s.store.Get(ctx, tokenKey(id))
	if err != nil {
		return nil, 0, err
	}
	t := new(Token)
	if err := json.Unmarshal(v, t); err != nil {
		return nil, 0, fmt.Errorf("token %s: decode: %w", id, err)
	}
	return t, rev, nil
}

// Authenticate returns the principal of a bearer secret. It reads the
// store on every call (no cache), so a revoked or expired token fails at
// once.
func (s *Service) Authenticate(ctx context.Context, secret string) (Principal, error) {
	rest, ok := strings.CutPrefix(secret, tokenPrefix)
	id, _, ok2 := strings.Cut(rest, "_")
	if !ok || !ok2 || !tokenIDPattern.MatchString(id) {
		return Principal{}, errdefs.Unauthenticated("token: not a corral token (want %s<id>_<secret>)", tokenPrefix)
	}
	t, _, err := s.getToken(ctx, id)
	if errdefs.IsNotFound(err) {
		return Principal{}, errdefs.Unauthenticated("token %s: unknown or revoked", id)
	}
	if err != nil {
		return Principal{}, fmt.Errorf("token %s: %w", id, err)
	}
	if subtle.ConstantTimeCompare([]byte(t.Hash), []byte(hashSecret(secret))) != 1 {
		return Principal{}, errdefs.Unauthenticated("token %s: wrong secret", id)
	}
	if !t.ExpiresAt.IsZero() && !s.now().Before(t.ExpiresAt) {
		return Principal{}, errdefs.Unauthenticated("token %s: expired at %s", id, t.ExpiresAt.Format(time.RFC3339))
	}
	if _, _, err := s.store.Get(ctx, projectKey(t.Project)); err != nil {
		return Principal{}, errdefs.Unauthenticated("token %s: project %s no longer exists", id, t.Project)
	}
	return Principal{Project: t.Project, Role: t.Role, TokenID: t.ID}, nil
}

// ListTokens returns the tokens of the projects p administers (under
// project, when given). Hashes are left out.
func (s *Service) ListTokens(ctx context.Context, p Principal, project string) ([]*Token, error) {
	if project != "" && !p.Sees(project) {
		return nil, errdefs.NotFound("project %s: not found", project)
	}
	if !p.Administers(or(project, p.Project)) {
		return nil, errdefs.PermissionDenied("tokens: %s may not list tokens (needs the admin role)", p)
	}
	out, err := listRecords(ctx, s.store, "tokens/", func(t *Token) bool {
		return p.Administers(t.Project) && Within(t.Project, project)
	})
	for _, t := range out {
		t.Hash = ""
	}
	return out, err
}

// RevokeToken deletes token id: an admin of its project may, and any
// token may revoke itself.
func (s *Service) RevokeToken(ctx context.Context, p Principal, id string) (*Token, error) {
	if !tokenIDPattern.MatchString(id) {
		return nil, errdefs.InvalidArgument("token id: %q is not a token id (12 hex digits)", id)
	}
	t, rev, err := s.getToken(ctx, id)
	if errdefs.IsNotFound(err) || (err == nil && !p.Sees(t.Project) && id != p.TokenID) {
		return nil, errdefs.NotFound("token %s: not found", id)
	}
	if err != nil {
		return nil, err
	}
	if !p.Administers(t.Project) && id != p.TokenID {
		return nil, errdefs.PermissionDenied("token %s: %s may not revoke it (needs the admin role in %s)", id, p, t.Project)
	}
	if err := s.store.Txn(ctx, []Cond{{Key: tokenKey(id), Rev: rev}}, []Write{{Key: tokenKey(id), Delete: true}}); err != nil {
		return nil, fmt.Errorf("revoke token %s: %w", id, err)
	}
	t.Hash = ""
	return t, nil
}

// TokenInfo returns the record of the token p authenticated with (nil
// for the node administrator).
func (s *Service) TokenInfo(ctx context.Context, p Principal) (*Token, error) {
	if p.TokenID == "" {
		return nil, nil
	}
	t, _, err := s.getToken(ctx, p.TokenID)
	if err != nil {
		return nil, err
	}
	t.Hash = ""
	return t, nil
}
