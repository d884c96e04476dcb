package client

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// Quota bounds a project and its subprojects; a zero field is no limit of
// the project's own (its ancestors' limits still apply).
type Quota struct {
	MaxSandboxes  int64
	CPUMillis     int64
	MemoryBytes   int64
	DiskBytes     int64
	CreatesPerSec float64
	CallsPerSec   float64
}

// Usage is what a project's live sandboxes (its subprojects' included) use.
type Usage struct {
	Sandboxes   int64
	CPUMillis   int64
	MemoryBytes int64
	DiskBytes   int64
}

// Project is one project of the tree ("job42/agent7").
type Project struct {
	Path string
	// Quota is the project's own limit; Delegated the sum of its direct
	// subprojects' quotas.
	Quota, Delegated Quota
	Usage            Usage
	CreatedAt        time.Time
	CreatedBy        string
}

// Token describes a bearer token; its secret is returned only by
// CreateToken.
type Token struct {
	ID          string
	Project     string
	Role        string // admin, member or viewer
	Description string
	CreatedAt   time.Time
	ExpiresAt   time.Time // zero: never
	CreatedBy   string
}

// Identity is who the server takes the caller for.
type Identity struct {
	NodeAdmin bool
	Project   string
	Role      string
	Token     *Token // nil for the node administrator
}

// TokenOptions configures CreateToken.
type TokenOptions struct {
	Project string
	// Role is admin, member (default) or viewer.
	Role string
	// TTL is how long the token works (0: until revoked).
	TTL         time.Duration
	Description string
}

// AuditEntry is one management request from the audit log.
type AuditEntry struct {
	Key       string
	Time      time.Time
	NodeAdmin bool
	TokenID   string
	Project   string
	Procedure string
	Summary   string
	Result    string
}

// AuditFilter selects audit entries.
type AuditFilter struct {
	Project string
	After   string // an entry's Key: later entries only
	Limit   int    // the last Limit (0: all)
}

// WhoAmI describes the caller.
func (c *Client) WhoAmI(ctx context.Context) (*Identity, error) {
	resp, err := c.iam.WhoAmI(ctx, connect.NewRequest(&corralv1.WhoAmIRequest{}))
	if err != nil {
		return nil, wrapErr(err)
	}
	m := resp.Msg
	return &Identity{NodeAdmin: m.NodeAdmin, Project: m.Project, Role: m.Role, Token: tokenFromProto(m.Token)}, nil
}

// CreateToken makes a token and returns it with its secret (shown once).
func (c *Client) CreateToken(ctx context.Context, o TokenOptions) (*Token, string, error) {
	resp, err := c.iam.CreateToken(ctx, connect.NewRequest(&corralv1.CreateTokenRequest{
		Project: o.Project, Role: o.Role, TtlSeconds: int64((o.TTL + time.Second - 1) / time.Second), Description: o.Description}))
	if err != nil {
		return nil, "", wrapErr(err)
	}
	return tokenFromProto(resp.Msg.Token), resp.Msg.Secret, nil
}

// ListTokens lists the tokens the caller administers (of project and
// beneath, when given).
func (c *Client) ListTokens(ctx context.Context, project string) ([]*Token, error) {
	resp, err := c.iam.ListTokens(ctx, connect.NewRequest(&corralv1.ListTokensRequest{Project: project}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return fromProtos(resp.Msg.Tokens, tokenFromProto), nil
}

// RevokeToken makes token id fail from now on.
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	_, err := c.iam.RevokeToken(ctx, connect.NewRequest(&corralv1.RevokeTokenRequest{Id: id}))
	return wrapErr(err)
}

// CreateProject makes project path; a subproject's quota comes out of
// what its parent has left.
func (c *Client) CreateProject(ctx context.Context, path string, q Quota) (*Project, error) {
	resp, err := c.iam.CreateProject(ctx, connect.NewRequest(&corralv1.CreateProjectRequest{Path: path, Quota: quotaToProto(q)}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return projectFromProto(resp.Msg.Project), nil
}

// ListProjects lists the projects the caller sees.
func (c *Client) ListProjects(ctx context.Context) ([]*Project, error) {
	resp, err := c.iam.ListProjects(ctx, connect.NewRequest(&corralv1.ListProjectsRequest{}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return fromProtos(resp.Msg.Projects, projectFromProto), nil
}

// GetProject describes project path with its usage.
func (c *Client) GetProject(ctx context.Context, path string) (*Project, error) {
	resp, err := c.iam.GetProject(ctx, connect.NewRequest(&corralv1.GetProjectRequest{Path: path}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return projectFromProto(resp.Msg.Project), nil
}

// SetQuota replaces project path's quota.
func (c *Client) SetQuota(ctx context.Context, path string, q Quota) (*Project, error) {
	resp, err := c.iam.SetQuota(ctx, connect.NewRequest(&corralv1.SetQuotaRequest{Path: path, Quota: quotaToProto(q)}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return projectFromProto(resp.Msg.Project), nil
}

// DeleteProject deletes project path with its subprojects, tokens,
// sandboxes and images; with keep it refuses a project holding anything.
func (c *Client) DeleteProject(ctx context.Context, path string, keep bool) error {
	_, err := c.iam.DeleteProject(ctx, connect.NewRequest(&corralv1.DeleteProjectRequest{Path: path, Keep: keep}))
	return wrapErr(err)
}

// Audit lists audit entries, oldest first.
func (c *Client) Audit(ctx context.Context, f AuditFilter) ([]AuditEntry, error) {
	resp, err := c.iam.ListAudit(ctx, connect.NewRequest(&corralv1.ListAuditRequest{Project: f.Project, After: f.After, Limit: int32(f.Limit)}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return fromProtos(resp.Msg.Entries, auditFromProto), nil
}

// FollowAudit calls fn with the entries Audit would return, then with each
// new one as it is recorded, until ctx ends (nil) or fn or the stream fails.
func (c *Client) FollowAudit(ctx context.Context, f AuditFilter, fn func(AuditEntry) error) error {
	stream, err := c.iam.StreamAudit(ctx, connect.NewRequest(&corralv1.ListAuditRequest{Project: f.Project, After: f.After, Limit: int32(f.Limit)}))
	if err != nil {
		return wrapErr(err)
	}
	defer stream.Close()
	for stream.Receive() {
		if err := fn(auditFromProto(stream.Msg())); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return wrapErr(stream.Err())
}

func tsTime(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}

func tokenFromProto(t *corralv1.Token) *Token {
	if t == nil {
		return nil
	}
	return &Token{ID: t.Id, Project: t.Project, Role: t.Role, Description: t.Description,
		CreatedAt: tsTime(t.CreatedAt), ExpiresAt: tsTime(t.ExpiresAt), CreatedBy: t.CreatedBy}
}

func quotaToProto(q Quota) *corralv1.Quota {
	return &corralv1.Quota{MaxSandboxes: q.MaxSandboxes, CpuMillis: q.CPUMillis, MemoryBytes: q.MemoryBytes,
		DiskBytes: q.DiskBytes, CreatesPerSec: q.CreatesPerSec, CallsPerSec: q.CallsPerSec}
}

func quotaFromProto(q *corralv1.Quota) Quota {
	return Quota{MaxSandboxes: q.GetMaxSandboxes(), CPUMillis: q.GetCpuMillis(), MemoryBytes: q.GetMemoryBytes(),
		DiskBytes: q.GetDiskBytes(), CreatesPerSec: q.GetCreatesPerSec(), CallsPerSec: q.GetCallsPerSec()}
}

func projectFromProto(p *corralv1.Project) *Project {
	u := p.GetUsage()
	return &Project{Path: p.GetPath(), Quota: quotaFromProto(p.GetQuota()), Delegated: quotaFromProto(p.GetDelegated()),
		Usage:     Usage{Sandboxes: u.GetSandboxes(), CPUMillis: u.GetCpuMillis(), MemoryBytes: u.GetMemoryBytes(), DiskBytes: u.GetDiskBytes()},
		CreatedAt: tsTime(p.GetCreatedAt()), CreatedBy: p.GetCreatedBy()}
}

func auditFromProto(e *corralv1.AuditEntry) AuditEntry {
	return AuditEntry{Key: e.Key, Time: tsTime(e.Time), NodeAdmin: e.NodeAdmin, TokenID: e.TokenId, Project: e.Project,
		Procedure: e.Procedure, Summary: e.Summary, Result: e.Result}
}

// ShareImage lets project (and its subprojects) use the image name of
// ref (every version); the caller must be an admin of the name's project.
func (c *Client) ShareImage(ctx context.Context, ref, project string) error {
	_, err := c.iam.ShareImage(ctx, connect.NewRequest(&corralv1.ShareImageRequest{Name: ref, Project: project}))
	return wrapErr(err)
}

// UnshareImage takes back a ShareImage.
func (c *Client) UnshareImage(ctx context.Context, ref, project string) error {
	_, err := c.iam.ShareImage(ctx, connect.NewRequest(&corralv1.ShareImageRequest{Name: ref, Project: project, Unshare: true}))
	return wrapErr(err)
}
