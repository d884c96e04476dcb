package control

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// access is what a procedure needs of its caller.
type access int

const (
	// accessRead: any role.
	accessRead access = iota
	// accessWrite: admin or member (never viewer).
	accessWrite
	// accessIAM: the IAM service decides (roles within projects).
	accessIAM
	// accessNode: the node administrator only (node-wide or host-path
	// operations).
	accessNode
)

// rule is how the guard treats one procedure.
type rule struct {
	access access
	// sandbox names the request field carrying a sandbox id the caller's
	// project must see ("" none).
	sandbox string
	// audit records the call in the audit log.
	audit bool
	// auditEarly (with audit): the entry is written while the call runs,
	// not after it (iam.BeginRecord), for calls that take about as long as
	// the audit log's sync: an exec's answer waits for one or the other,
	// not both in turn.
	auditEarly bool
}

// rules classifies every procedure of every service. A procedure missing
// here is refused to every token (TestEveryProcedureHasARule keeps the
// table complete).
var rules = map[string]rule{
	corralv1connect.SandboxServiceCreateProcedure:        {access: accessWrite, audit: true},
	corralv1connect.SandboxServiceGetProcedure:           {access: accessRead, sandbox: "id"},
	corralv1connect.SandboxServiceListProcedure:          {access: accessRead},
	corralv1connect.SandboxServiceDeleteProcedure:        {access: accessWrite, sandbox: "id", audit: true},
	corralv1connect.SandboxServiceExecProcedure:          {access: accessWrite, sandbox: "sandbox_id", audit: true, auditEarly: true},
	corralv1connect.SandboxServiceRunProcedure:           {access: accessWrite, sandbox: "sandbox_id", audit: true, auditEarly: true},
	corralv1connect.SandboxServiceWriteFileProcedure:     {access: accessWrite, sandbox: "sandbox_id"},
	corralv1connect.SandboxServiceReadFileProcedure:      {access: accessRead, sandbox: "sandbox_id"},
	corralv1connect.SandboxServiceListDirProcedure:       {access: accessRead, sandbox: "sandbox_id"},
	corralv1connect.SandboxServiceStatProcedure:          {access: accessRead, sandbox: "sandbox_id"},
	corralv1connect.SandboxServiceRemoveProcedure:        {access: accessWrite, sandbox: "sandbox_id"},
	corralv1connect.SandboxServiceMakeDirProcedure:       {access: accessWrite, sandbox: "sandbox_id"},
	corralv1connect.SandboxServicePauseProcedure:         {access: accessWrite, sandbox: "id", audit: true},
	corralv1connect.SandboxServiceResumeProcedure:        {access: accessWrite, sandbox: "id", audit: true},
	corralv1connect.SandboxServiceUpdateNetworkProcedure: {access: accessWrite, sandbox: "id", audit: true},
	corralv1connect.SandboxServiceNetworkStatsProcedure:  {access: accessRead, sandbox: "id"},
	// Streams: every message is checked as it arrives; the first names
	// the sandbox (ExecStream's inside its exec, see checkMessage).
	corralv1connect.SandboxServiceUploadFileProcedure: {access: accessWrite, sandbox: "sandbox_id"},
	corralv1connect.SandboxServiceCopyInProcedure:     {access: accessWrite, sandbox: "sandbox_id"},
	corralv1connect.SandboxServiceCopyOutProcedure:    {access: accessRead, sandbox: "sandbox_id"},
	corralv1connect.SandboxServiceExecStreamProcedure: {access: accessWrite, audit: true},
	corralv1connect.SandboxServiceRunStreamProcedure:  {access: accessWrite, audit: true},

	// VM images are node-wide, as layers are; a build runs mmdebstrap
	// on the node, so it is the node administrator's.
	corralv1connect.VMServiceListVMImagesProcedure:  {access: accessRead},
	corralv1connect.VMServiceImportVMImageProcedure: {access: accessWrite, audit: true},
	corralv1connect.VMServiceBuildVMImageProcedure:  {access: accessNode, audit: true},
	corralv1connect.VMServiceRemoveVMImageProcedure: {access: accessWrite, audit: true},
	// The screen is read like a file; input drives the sandbox like exec.
	corralv1connect.VMServiceScreenshotProcedure: {access: accessRead, sandbox: "sandbox_id"},
	corralv1connect.VMServiceSendInputProcedure:  {access: accessWrite, sandbox: "sandbox_id", audit: true},
	// The token it returns opens the screen, keyboard and mouse: as
	// SendInput, and only to the sandbox's project.
	corralv1connect.VMServiceLiveViewProcedure: {access: accessWrite, sandbox: "sandbox_id", audit: true},

	corralv1connect.ImageServiceListImagesProcedure: {access: accessRead},
	// CreateLayer reads a path on the node: the node administrator's alone.
	corralv1connect.ImageServiceCreateLayerProcedure:       {access: accessNode, audit: true},
	corralv1connect.ImageServiceCreateCompositionProcedure: {access: accessWrite, audit: true},
	corralv1connect.ImageServiceImportImageProcedure:       {access: accessWrite, audit: true},
	corralv1connect.ImageServiceRemoveImageProcedure:       {access: accessWrite, audit: true},
	corralv1connect.ImageServiceCollectGarbageProcedure:    {access: accessNode, audit: true},
	corralv1connect.ImageServicePackProcedure:              {access: accessWrite, sandbox: "sandbox_id", audit: true},
	corralv1connect.ImageServicePullLayerProcedure:         {access: accessWrite, audit: true},
	// Uploads carry their content from the client: any member may.
	corralv1connect.ImageServiceUploadLayerProcedure: {access: accessWrite, audit: true},
	corralv1connect.ImageServiceUploadImageProcedure: {access: accessWrite, audit: true},
	// A build runs the recipe as root on the node (mmdebstrap for debian)
	// and replaces a node-wide image: the node administrator's alone.
	corralv1connect.ImageServiceBuildImageProcedure: {access: accessNode, audit: true},

	// Stats and events are filtered to the caller's projects by the
	// handlers; Nodes reports node-wide totals only.
	corralv1connect.ObserveServiceStatsProcedure:       {access: accessRead},
	corralv1connect.ObserveServiceWatchEventsProcedure: {access: accessRead},
	corralv1connect.ObserveServiceNodesProcedure:       {access: accessRead},

	// The exec log holds commands and their output: readable by whoever
	// may see the sandbox.
	corralv1connect.RolloutServiceListExecsProcedure: {access: accessRead, sandbox: "sandbox_id"},
	// By label: the handler pauses only sandboxes of the caller's projects.
	corralv1connect.RolloutServicePauseManyProcedure:  {access: accessWrite, audit: true},
	corralv1connect.RolloutServiceResumeManyProcedure: {access: accessWrite, audit: true},
	// Forks are made in the parent's project, under its quota.
	corralv1connect.RolloutServiceForkProcedure: {access: accessWrite, sandbox: "sandbox_id", audit: true},
	// A snapshot holds the sandbox's memory: taken by whoever may write
	// to the sandbox; restores land in the snapshot's project, under its
	// quota. The snapshot handlers hide other projects' snapshots
	// (NotFound, as for sandboxes).
	corralv1connect.RolloutServiceSnapshotProcedure:       {access: accessWrite, sandbox: "sandbox_id", audit: true},
	corralv1connect.RolloutServiceRestoreProcedure:        {access: accessWrite, audit: true},
	corralv1connect.RolloutServiceListSnapshotsProcedure:  {access: accessRead},
	corralv1connect.RolloutServiceDeleteSnapshotProcedure: {access: accessWrite, audit: true},

	// A migration picks the node a sandbox runs on, which is placement's
	// and the operator's business (as draining a node is), not a
	// project's: the cluster administrator's. The node-side steps name
	// snapshots of any project and are served only on a node's cluster
	// listener, behind the cluster secret; the rules keep tokens off them
	// wherever they might be served.
	corralv1connect.MigrationServiceMigrateProcedure:        {access: accessNode, audit: true},
	corralv1connect.MigrationServiceExportSnapshotProcedure: {access: accessNode, audit: true},
	corralv1connect.MigrationServiceImportSnapshotProcedure: {access: accessNode, audit: true},
	corralv1connect.MigrationServiceAdoptSnapshotProcedure:  {access: accessNode, audit: true},
	corralv1connect.MigrationServiceFenceSnapshotProcedure:  {access: accessNode, audit: true},
	corralv1connect.MigrationServiceHoldFenceProcedure:      {access: accessNode, audit: true},
	corralv1connect.MigrationServiceLiftFenceProcedure:      {access: accessNode, audit: true},

	corralv1connect.FnCallServiceCallProcedure:      {access: accessWrite},
	corralv1connect.FnCallServiceCallBatchProcedure: {access: accessWrite},

	// A control instance's view of the nodes; draining moves a node out
	// of placement for everyone: the cluster administrator's (root on a
	// control instance's socket).
	corralv1connect.ClusterServiceListNodesProcedure: {access: accessRead},
	corralv1connect.ClusterServiceDrainNodeProcedure: {access: accessNode, audit: true},

	corralv1connect.IAMServiceWhoAmIProcedure:        {access: accessRead},
	corralv1connect.IAMServiceCreateTokenProcedure:   {access: accessIAM, audit: true},
	corralv1connect.IAMServiceListTokensProcedure:    {access: accessIAM},
	corralv1connect.IAMServiceRevokeTokenProcedure:   {access: accessIAM, audit: true},
	corralv1connect.IAMServiceCreateProjectProcedure: {access: accessIAM, audit: true},
	corralv1connect.IAMServiceListProjectsProcedure:  {access: accessIAM},
	corralv1connect.IAMServiceGetProjectProcedure:    {access: accessIAM},
	corralv1connect.IAMServiceSetQuotaProcedure:      {access: accessIAM, audit: true},
	corralv1connect.IAMServiceDeleteProjectProcedure: {access: accessIAM, audit: true},
	corralv1connect.IAMServiceShareImageProcedure:    {access: accessIAM, audit: true},
	corralv1connect.IAMServiceListAuditProcedure:     {access: accessIAM},
	corralv1connect.IAMServiceStreamAuditProcedure:   {access: accessIAM},
}

// Guard is the interceptor in front of every service: it authenticates
// the caller (the principal the listener set, or a bearer token),
// enforces each procedure's rule, hides other projects' sandboxes and
// images, applies call-rate quotas and appends management requests to the
// audit log before answering.
type Guard struct {
	IAM *iam.Service
	// SandboxProject returns the project of sandbox id (an error wrapping
	// errdefs.ErrNotFound when there is no such sandbox).
	SandboxProject func(ctx context.Context, id string) (string, error)
	// Images tracks which project owns which image name.
	Images *ImageOwners
}

var _ connect.Interceptor = (*Guard)(nil)

// NodeAdminContext marks ctx as coming over the node administrator's
// channel (root on the unix socket). The server calls it per connection.
func NodeAdminContext(ctx context.Context) context.Context {
	return iam.WithPrincipal(ctx, iam.Principal{NodeAdmin: true})
}

// authenticate returns ctx carrying the caller's principal.
func (g *Guard) authenticate(ctx context.Context, header interface{ Get(string) string }) (context.Context, iam.Principal, error) {
	if p, ok := iam.FromContext(ctx); ok {
		return ctx, p, nil
	}
	auth := header.Get("Authorization")
	secret, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || secret == "" {
		return ctx, iam.Principal{}, errdefs.Unauthenticated("no token: send Authorization: Bearer <token> (CORRAL_TOKEN; make one with 'corral token create' on the node)")
	}
	p, err := g.IAM.Authenticate(ctx, strings.TrimSpace(secret))
	if err != nil {
		return ctx, iam.Principal{}, err
	}
	return iam.WithPrincipal(ctx, p), p, nil
}

// authorize applies procedure's rule to a request message.
func (g *Guard) authorize(ctx context.Context, p iam.Principal, procedure string, msg any) error {
	r, ok := rules[procedure]
	if !ok {
		if p.NodeAdmin {
			return nil
		}
		return errdefs.PermissionDenied("%s: not open to tokens", procedure)
	}
	switch r.access {
	case accessWrite:
		if !p.CanWrite() {
			return errdefs.PermissionDenied("%s: %s may only read (the viewer role)", procedure, p)
		}
	case accessNode:
		if !p.NodeAdmin {
			return errdefs.PermissionDenied("%s: only the node administrator (root on the node's unix socket) may do this", procedure)
		}
	}
	if p.NodeAdmin {
		return nil
	}
	m, _ := msg.(proto.Message)
	if m == nil {
		return nil
	}
	if r.sandbox != "" {
		id := stringField(m, r.sandbox)
		if err := g.checkSandbox(ctx, p, id); err != nil {
			return err
		}
	}
	return g.checkMessage(ctx, p, procedure, m)
}

// Authorize applies procedure's rule to msg for the principal in ctx, as
// the interceptor does, for callers that reach the handlers directly (the
// E2B API). A context without a principal is refused.
func (g *Guard) Authorize(ctx context.Context, procedure string, msg any) error {
	p, ok := iam.FromContext(ctx)
	if !ok {
		return errdefs.Unauthenticated("%s: no authenticated caller", procedure)
	}
	return g.authorize(ctx, p, procedure, msg)
}

// checkSandbox hides sandboxes of projects p does not see: missing and
// foreign both get the same NotFound.
func (g *Guard) checkSandbox(ctx context.Context, p iam.Principal, id string) error {
	if id == "" {
		return nil // the handler names the missing field
	}
	project, err := g.SandboxProject(ctx, id)
	if err != nil && !errdefs.IsNotFound(err) {
		return err // a malformed id says nothing about other projects
	}
	if err != nil || !p.Sees(project) {
		return errdefs.NotFound("sandbox %s: not found", truncateID(id))
	}
	return nil
}

// checkMessage checks what a request names besides a sandbox: images it
// uses or makes, sources it reads, and call-rate quotas.
func (g *Guard) checkMessage(ctx context.Context, p iam.Principal, procedure string, m proto.Message) error {
	switch msg := m.(type) {
	case *corralv1.CreateRequest:
		return g.Images.CheckUse(ctx, p, msg.Image)
	case *corralv1.CallRequest:
		if err := g.Images.CheckUse(ctx, p, msg.Image); err != nil {
			return err
		}
		return g.IAM.AdmitCalls(ctx, p.Project, 1)
	case *corralv1.CallBatchRequest:
		for _, c := range msg.Calls {
			if err := g.Images.CheckUse(ctx, p, c.Image); err != nil {
				return err
			}
		}
		return g.IAM.AdmitCalls(ctx, p.Project, max(1, len(msg.Calls)))
	case *corralv1.CreateCompositionRequest:
		c := msg.GetComposition()
		for _, l := range c.GetLayers() {
			if err := g.Images.CheckUse(ctx, p, l); err != nil {
				return err
			}
		}
		return g.Images.Claim(ctx, p, c.GetRef())
	case *corralv1.ImportImageRequest:
		if hostPathSource(msg.Source) {
			return errdefs.PermissionDenied("source %q: reads a path on the node; only the node administrator may import from one", msg.Source)
		}
		return g.Images.Claim(ctx, p, msg.Name)
	case *corralv1.PackRequest:
		return g.Images.Claim(ctx, p, msg.Name)
	case *corralv1.UploadLayerRequest:
		if msg.Name == "" { // a data message after the first
			return nil
		}
		return g.Images.Claim(ctx, p, msg.Name)
	case *corralv1.UploadImageRequest:
		if msg.Name == "" {
			return nil
		}
		return g.Images.Claim(ctx, p, msg.Name)
	case *corralv1.ExecStreamRequest:
		if msg.Exec == nil { // stdin after the first message
			return nil
		}
		if msg.Exec.SandboxId == "" {
			return errdefs.InvalidArgument("exec.sandbox_id: required")
		}
		return g.checkSandbox(ctx, p, msg.Exec.SandboxId)
	case *corralv1.StatsRequest:
		for _, id := range msg.Ids {
			if err := g.checkSandbox(ctx, p, id); err != nil {
				return err
			}
		}
	case *corralv1.PullLayerRequest:
		return g.Images.Claim(ctx, p, msg.Name)
	case *corralv1.RemoveImageRequest:
		return g.Images.CheckOwn(ctx, p, msg.Name)
	}
	return nil
}

// hostPathSource reports an import source naming a path on the node.
func hostPathSource(source string) bool {
	return strings.HasPrefix(source, "oci:") || strings.HasPrefix(source, "docker-archive:")
}

func stringField(m proto.Message, name string) string {
	r := m.ProtoReflect()
	fd := r.Descriptor().Fields().ByName(protoreflect.Name(name))
	if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() {
		return ""
	}
	return r.Get(fd).String()
}

// summaryFields are the request fields an audit entry's summary shows:
// names and ids, never contents, commands or secrets.
var summaryFields = []string{"id", "sandbox_id", "image", "backend", "name", "source", "path", "project", "role", "digest", "ref", "mode"}

func summarize(req, resp any) string {
	var kv []string
	if m, ok := req.(proto.Message); ok && m != nil {
		for _, f := range summaryFields {
			kv = append(kv, f, stringField(m, f))
		}
		if c, ok := m.(*corralv1.CreateCompositionRequest); ok {
			kv = append(kv, "ref", c.GetComposition().GetRef())
		}
	}
	if r, ok := resp.(*corralv1.CreateResponse); ok {
		kv = append(kv, "created", r.GetSandbox().GetId())
	}
	if r, ok := resp.(*corralv1.CreateTokenResponse); ok {
		kv = append(kv, "token", r.GetToken().GetId())
	}
	return iam.Summarize(kv...)
}

func resultOf(err error) string {
	if err == nil {
		return "ok"
	}
	msg := err.Error()
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code().String() + ": " + ce.Message()
	}
	return codeOf(err).String() + ": " + msg
}

// audit appends the entry of one finished call; a failure to record it
// fails the call, so no acknowledged request is missing from the log.
func (g *Guard) audit(ctx context.Context, p iam.Principal, procedure string, req, resp any, err error) error {
	if !rules[procedure].audit {
		return err
	}
	rerr := g.IAM.Record(ctx, p, iam.AuditEntry{Procedure: procedure, Summary: summarize(req, resp), Result: resultOf(err)})
	if rerr != nil && err == nil {
		return fmt.Errorf("%s done but not recorded: %w", procedure, rerr)
	}
	return err
}

// beginAudit starts the entry of an auditEarly call (nil for others).
func (g *Guard) beginAudit(p iam.Principal, procedure string, req any) *iam.AuditBegun {
	if r := rules[procedure]; !r.audit || !r.auditEarly {
		return nil
	}
	return g.IAM.BeginRecord(p, iam.AuditEntry{Procedure: procedure, Summary: summarize(req, nil)})
}

// finishAudit completes a begun entry with the call's result, as audit does.
func finishAudit(b *iam.AuditBegun, procedure string, err error) error {
	if rerr := b.Finish(resultOf(err)); rerr != nil && err == nil {
		return fmt.Errorf("%s done but not recorded: %w", procedure, rerr)
	}
	return err
}

func (g *Guard) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		procedure := req.Spec().Procedure
		ctx, p, err := g.authenticate(ctx, req.Header())
		if err != nil {
			return nil, err
		}
		if err := g.authorize(ctx, p, procedure, req.Any()); err != nil {
			return nil, g.audit(ctx, p, procedure, req.Any(), nil, err)
		}
		early := g.beginAudit(p, procedure, req.Any())
		resp, err := next(ctx, req)
		var msg any
		if resp != nil {
			msg = resp.Any()
			g.filter(ctx, p, msg)
		}
		if early != nil {
			err = finishAudit(early, procedure, err)
		} else {
			err = g.audit(ctx, p, procedure, req.Any(), msg, err)
		}
		if err != nil {
			return nil, err
		}
		return resp, nil
	}
}

func (g *Guard) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (g *Guard) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		procedure := conn.Spec().Procedure
		ctx, p, err := g.authenticate(ctx, conn.RequestHeader())
		if err != nil {
			return err
		}
		gc := &guardedConn{StreamingHandlerConn: conn, check: func(msg any) error {
			return g.authorize(ctx, p, procedure, msg)
		}}
		gc.begin = func(msg any) *iam.AuditBegun { return g.beginAudit(p, procedure, msg) }
		err = next(ctx, gc)
		if gc.early != nil {
			return finishAudit(gc.early, procedure, err)
		}
		return g.audit(ctx, p, procedure, gc.req, nil, err)
	}
}

// guardedConn authorises a stream's request message when the handler
// receives it (Connect hands handlers the connection, not the message).
type guardedConn struct {
	connect.StreamingHandlerConn
	check func(msg any) error
	req   any
	// begin starts the entry of an auditEarly call once its first message
	// passed the check; early is what it returned.
	begin func(msg any) *iam.AuditBegun
	early *iam.AuditBegun
}

func (c *guardedConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	first := c.req == nil
	if first {
		c.req = msg
	}
	if err := c.check(msg); err != nil {
		return err
	}
	if first {
		c.early = c.begin(msg)
	}
	return nil
}

// filter removes from a response what p may not see.
func (g *Guard) filter(ctx context.Context, p iam.Principal, msg any) {
	if p.NodeAdmin {
		return
	}
	if r, ok := msg.(*corralv1.ListImagesResponse); ok {
		g.Images.Filter(ctx, p, r)
	}
}

// CallerProject is the project the request's caller acts in ("" for the
// node administrator).
func CallerProject(ctx context.Context) string {
	p, _ := iam.FromContext(ctx)
	return p.Project
}

// VisibleTo returns a filter keeping what the caller sees (nil: all).
func VisibleTo(ctx context.Context) func(project string) bool {
	p, ok := iam.FromContext(ctx)
	if !ok || p.NodeAdmin {
		return nil
	}
	return p.Sees
}

func truncateID(id string) string {
	if len(id) > 64 {
		return id[:64] + "…"
	}
	return id
}
