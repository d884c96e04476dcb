package control

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// IAMService implements corral.v1.IAMService over iam.Service; the Guard
// in front of it has put the caller's principal in every context.
type IAMService struct {
	iam    *iam.Service
	images *ImageOwners
}

var _ corralv1connect.IAMServiceHandler = (*IAMService)(nil)

// NewIAMService serves svc; images keeps image names' owners and shares.
func NewIAMService(svc *iam.Service, images *ImageOwners) *IAMService {
	return &IAMService{iam: svc, images: images}
}

func (s *IAMService) ShareImage(ctx context.Context, req *connect.Request[corralv1.ShareImageRequest]) (*connect.Response[corralv1.ShareImageResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.images.Share(ctx, p, req.Msg.Name, req.Msg.Project, req.Msg.Unshare); err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.ShareImageResponse{}), nil
}

func principal(ctx context.Context) (iam.Principal, error) {
	p, ok := iam.FromContext(ctx)
	if !ok {
		return p, errdefs.Unauthenticated("no principal")
	}
	return p, nil
}

func (s *IAMService) WhoAmI(ctx context.Context, _ *connect.Request[corralv1.WhoAmIRequest]) (*connect.Response[corralv1.WhoAmIResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	t, err := s.iam.TokenInfo(ctx, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.WhoAmIResponse{NodeAdmin: p.NodeAdmin, Project: p.Project, Role: string(p.Role), Token: tokenToProto(t)}), nil
}

func (s *IAMService) CreateToken(ctx context.Context, req *connect.Request[corralv1.CreateTokenRequest]) (*connect.Response[corralv1.CreateTokenResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	role := iam.Role(m.Role)
	if role == "" {
		role = iam.RoleMember
	}
	t, secret, err := s.iam.CreateToken(ctx, p, m.Project, role, time.Duration(m.TtlSeconds)*time.Second, m.Description)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.CreateTokenResponse{Token: tokenToProto(t), Secret: secret}), nil
}

func (s *IAMService) ListTokens(ctx context.Context, req *connect.Request[corralv1.ListTokensRequest]) (*connect.Response[corralv1.ListTokensResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	ts, err := s.iam.ListTokens(ctx, p, req.Msg.Project)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.ListTokensResponse{Tokens: toProtos(ts, tokenToProto)}), nil
}

func (s *IAMService) RevokeToken(ctx context.Context, req *connect.Request[corralv1.RevokeTokenRequest]) (*connect.Response[corralv1.RevokeTokenResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	t, err := s.iam.RevokeToken(ctx, p, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.RevokeTokenResponse{Token: tokenToProto(t)}), nil
}

func (s *IAMService) CreateProject(ctx context.Context, req *connect.Request[corralv1.CreateProjectRequest]) (*connect.Response[corralv1.CreateProjectResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	proj, err := s.iam.CreateProject(ctx, p, req.Msg.Path, quotaFromProto(req.Msg.Quota))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.CreateProjectResponse{Project: s.projectToProto(proj)}), nil
}

func (s *IAMService) ListProjects(ctx context.Context, _ *connect.Request[corralv1.ListProjectsRequest]) (*connect.Response[corralv1.ListProjectsResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	ps, err := s.iam.ListProjects(ctx, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.ListProjectsResponse{Projects: toProtos(ps, s.projectToProto)}), nil
}

func (s *IAMService) GetProject(ctx context.Context, req *connect.Request[corralv1.GetProjectRequest]) (*connect.Response[corralv1.GetProjectResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	proj, err := s.iam.GetProject(ctx, p, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.GetProjectResponse{Project: s.projectToProto(proj)}), nil
}

func (s *IAMService) SetQuota(ctx context.Context, req *connect.Request[corralv1.SetQuotaRequest]) (*connect.Response[corralv1.SetQuotaResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	proj, err := s.iam.SetQuota(ctx, p, req.Msg.Path, quotaFromProto(req.Msg.Quota))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.SetQuotaResponse{Project: s.projectToProto(proj)}), nil
}

func (s *IAMService) DeleteProject(ctx context.Context, req *connect.Request[corralv1.DeleteProjectRequest]) (*connect.Response[corralv1.DeleteProjectResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.iam.DeleteProject(ctx, p, req.Msg.Path, req.Msg.Keep); err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.DeleteProjectResponse{}), nil
}

func auditFilter(m *corralv1.ListAuditRequest) (iam.AuditFilter, error) {
	if m.Limit < 0 {
		return iam.AuditFilter{}, errdefs.InvalidArgument("limit: %d must not be negative", m.Limit)
	}
	return iam.AuditFilter{Project: m.Project, After: m.After, Limit: int(m.Limit)}, nil
}

func (s *IAMService) ListAudit(ctx context.Context, req *connect.Request[corralv1.ListAuditRequest]) (*connect.Response[corralv1.ListAuditResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	f, err := auditFilter(req.Msg)
	if err != nil {
		return nil, err
	}
	es, err := s.iam.ListAudit(ctx, p, f)
	if err != nil {
		return nil, err
	}
	out := &corralv1.ListAuditResponse{}
	for _, e := range es {
		out.Entries = append(out.Entries, auditToProto(e))
	}
	return connect.NewResponse(out), nil
}

func (s *IAMService) StreamAudit(ctx context.Context, req *connect.Request[corralv1.ListAuditRequest], stream *connect.ServerStream[corralv1.AuditEntry]) error {
	p, err := principal(ctx)
	if err != nil {
		return err
	}
	f, err := auditFilter(req.Msg)
	if err != nil {
		return err
	}
	return s.iam.FollowAudit(ctx, p, f, func(e iam.AuditEntry) error { return stream.Send(auditToProto(e)) })
}

func tokenToProto(t *iam.Token) *corralv1.Token {
	if t == nil {
		return nil
	}
	out := &corralv1.Token{Id: t.ID, Project: t.Project, Role: string(t.Role), Description: t.Description,
		CreatedAt: timestamppb.New(t.CreatedAt), CreatedBy: t.CreatedBy}
	if !t.ExpiresAt.IsZero() {
		out.ExpiresAt = timestamppb.New(t.ExpiresAt)
	}
	return out
}

func quotaFromProto(q *corralv1.Quota) iam.Quota {
	return iam.Quota{MaxSandboxes: q.GetMaxSandboxes(), CPUMillis: q.GetCpuMillis(), MemoryBytes: q.GetMemoryBytes(),
		DiskBytes: q.GetDiskBytes(), CreatesPerSec: q.GetCreatesPerSec(), CallsPerSec: q.GetCallsPerSec()}
}

func quotaToProto(q iam.Quota) *corralv1.Quota {
	return &corralv1.Quota{MaxSandboxes: q.MaxSandboxes, CpuMillis: q.CPUMillis, MemoryBytes: q.MemoryBytes,
		DiskBytes: q.DiskBytes, CreatesPerSec: q.CreatesPerSec, CallsPerSec: q.CallsPerSec}
}

func (s *IAMService) projectToProto(p *iam.Project) *corralv1.Project {
	u := s.iam.Usage(p.Path)
	return &corralv1.Project{Path: p.Path, Quota: quotaToProto(p.Quota), Delegated: quotaToProto(p.Delegated),
		Usage:     &corralv1.Usage{Sandboxes: u.Sandboxes, CpuMillis: u.CPUMillis, MemoryBytes: u.MemoryBytes, DiskBytes: u.DiskBytes},
		CreatedAt: timestamppb.New(p.CreatedAt), CreatedBy: p.CreatedBy}
}

func auditToProto(e iam.AuditEntry) *corralv1.AuditEntry {
	return &corralv1.AuditEntry{Key: e.Key, Time: timestamppb.New(e.Time), NodeAdmin: e.NodeAdmin, TokenId: e.TokenID,
		Project: e.Project, Procedure: e.Procedure, Summary: e.Summary, Result: e.Result}
}
