// Package control is corral's API layer: Connect handlers for
// corral.v1.SandboxService that route each request to the node owning the
// sandbox (the node id is part of the sandbox id) and translate between
// protobuf messages and node types. It keeps no per-sandbox state. It must
// not import the server, CLI or client packages.
package control

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sort"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/node"
)

// readChunk is the size of ReadFile and Exec stream messages.
const readChunk = 256 << 10

// Service implements SandboxService over a set of nodes.
type Service struct {
	nodes map[string]*node.Node
	// local takes requests that name no node (Create) in single-node mode.
	local *node.Node
	// lazyReads reports a sandbox's reads of lazily loaded layers (nil:
	// the node loads none lazily).
	lazyReads LazyReads
}

// LazyReads returns the lazy-loading figures of sandbox id.
type LazyReads func(ctx context.Context, id string) (*corralv1.LazyReadStats, error)

// SetLazyReads makes Get report lazy-loading figures.
func (s *Service) SetLazyReads(f LazyReads) { s.lazyReads = f }

var _ corralv1connect.SandboxServiceHandler = (*Service)(nil)

// NewService serves the given local node.
func NewService(local *node.Node) *Service {
	return &Service{nodes: map[string]*node.Node{local.ID(): local}, local: local}
}

// route finds the node that owns a sandbox id.
func (s *Service) route(id string) (*node.Node, error) {
	if id == "" {
		return nil, errdefs.InvalidArgument("id: required")
	}
	nodeID, err := node.NodeOf(id)
	if err != nil {
		return nil, err
	}
	n, ok := s.nodes[nodeID]
	if !ok && s.local.Has(id) {
		return s.local, nil // migrated here: its id names the node it was made on
	}
	if !ok {
		return nil, errdefs.NotFound("sandbox %s: node %s is not known to this server", id, nodeID)
	}
	return n, nil
}

func (s *Service) Create(ctx context.Context, req *connect.Request[corralv1.CreateRequest]) (*connect.Response[corralv1.CreateResponse], error) {
	cr, err := createFromProto(req.Msg)
	if err != nil {
		return nil, err
	}
	cr.Project = CallerProject(ctx)
	sb, err := s.local.Create(ctx, cr)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.CreateResponse{Sandbox: sandboxToProto(sb)}), nil
}

func (s *Service) Get(ctx context.Context, req *connect.Request[corralv1.GetRequest]) (*connect.Response[corralv1.GetResponse], error) {
	n, err := s.route(req.Msg.Id)
	if err != nil {
		return nil, err
	}
	sb, err := n.Get(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	out := sandboxToProto(sb)
	// Best effort too: a sandbox stopping meanwhile reports no memory.
	if m, ok, _ := n.Memory(ctx, sb.ID); ok {
		out.Memory = &corralv1.MemoryState{ResidentBytes: m.ResidentBytes, SwappedBytes: m.SwappedBytes, Reclaimed: sb.Reclaimed}
	}
	if s.lazyReads != nil {
		// Best effort: the figures never fail a Get.
		out.LazyReads, _ = s.lazyReads(ctx, sb.ID)
	}
	return connect.NewResponse(&corralv1.GetResponse{Sandbox: out}), nil
}

func (s *Service) List(ctx context.Context, req *connect.Request[corralv1.ListRequest]) (*connect.Response[corralv1.ListResponse], error) {
	phase, err := phaseOf(req.Msg.State)
	if err != nil {
		return nil, err
	}
	sbs, next, err := s.local.List(ctx, node.ListFilter{
		Labels:    req.Msg.Labels,
		Visible:   VisibleTo(ctx),
		Phase:     phase,
		PageSize:  int(req.Msg.PageSize),
		PageToken: req.Msg.PageToken,
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.ListResponse{NextPageToken: next, Sandboxes: toProtos(sbs, sandboxToProto)}), nil
}

func (s *Service) Delete(ctx context.Context, req *connect.Request[corralv1.DeleteRequest]) (*connect.Response[corralv1.DeleteResponse], error) {
	n, err := s.route(req.Msg.Id)
	if errdefs.IsNotFound(err) {
		// Idempotent: a sandbox on a node we do not know is gone for us.
		return connect.NewResponse(&corralv1.DeleteResponse{}), nil
	}
	if err != nil {
		return nil, err
	}
	existed, err := n.Delete(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.DeleteResponse{Existed: existed}), nil
}

func (s *Service) exec(ctx context.Context, msg *corralv1.ExecRequest, out backend.OutputFunc) (*corralv1.ExecResult, error) {
	n, err := s.route(msg.SandboxId)
	if err != nil {
		return nil, err
	}
	er, err := execFromProto(msg)
	if err != nil {
		return nil, err
	}
	if er.IdempotencyKey != "" {
		res, k, err := n.ExecKeyed(ctx, msg.SandboxId, er, out)
		if err != nil {
			return nil, err
		}
		p := resultToProto(res)
		p.ExecSeq, p.Replayed, p.ReplayOutputTruncated = k.Seq, k.Replayed, k.OutputTruncated
		return p, nil
	}
	res, err := n.Exec(ctx, msg.SandboxId, er, out)
	if err != nil {
		return nil, err
	}
	return resultToProto(res), nil
}

// sendOutput sends a command's output as ExecResponse messages of at most
// readChunk bytes.
func sendOutput(send func(*corralv1.ExecResponse) error) func(backend.Stream, []byte) error {
	return func(st backend.Stream, p []byte) error {
		for len(p) > 0 {
			chunk := p[:min(len(p), readChunk)]
			p = p[len(chunk):]
			msg := &corralv1.ExecResponse{}
			if st == backend.Stderr {
				msg.Event = &corralv1.ExecResponse_Stderr{Stderr: bytes.Clone(chunk)}
			} else {
				msg.Event = &corralv1.ExecResponse_Stdout{Stdout: bytes.Clone(chunk)}
			}
			if err := send(msg); err != nil {
				return err
			}
		}
		return nil
	}
}

func (s *Service) Exec(ctx context.Context, req *connect.Request[corralv1.ExecRequest], stream *connect.ServerStream[corralv1.ExecResponse]) error {
	res, err := s.exec(ctx, req.Msg, sendOutput(stream.Send))
	if err != nil {
		return err
	}
	return stream.Send(&corralv1.ExecResponse{Event: &corralv1.ExecResponse_Result{Result: res}})
}

func (s *Service) Run(ctx context.Context, req *connect.Request[corralv1.ExecRequest]) (*connect.Response[corralv1.RunResponse], error) {
	var stdout, stderr bytes.Buffer
	res, err := s.exec(ctx, req.Msg, func(st backend.Stream, p []byte) error {
		if st == backend.Stderr {
			stderr.Write(p)
		} else {
			stdout.Write(p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.RunResponse{
		Stdout: stdout.Bytes(),
		Stderr: stderr.Bytes(),
		Result: res,
	}), nil
}

func (s *Service) WriteFile(ctx context.Context, req *connect.Request[corralv1.WriteFileRequest]) (*connect.Response[corralv1.WriteFileResponse], error) {
	return s.writeFile(ctx, req.Msg, bytes.NewReader(req.Msg.Content))
}

func (s *Service) ReadFile(ctx context.Context, req *connect.Request[corralv1.ReadFileRequest], stream *connect.ServerStream[corralv1.ReadFileResponse]) error {
	m := req.Msg
	n, err := s.route(m.SandboxId)
	if err != nil {
		return err
	}
	if m.Offset < 0 || m.Limit < 0 {
		return errdefs.InvalidArgument("offset/limit: must not be negative (offset %d, limit %d)", m.Offset, m.Limit)
	}
	rc, err := n.ReadFile(ctx, m.SandboxId, m.Path, m.Offset, m.Limit)
	if err != nil {
		return err
	}
	defer rc.Close()
	buf := make([]byte, readChunk)
	for {
		k, err := io.ReadFull(rc, buf)
		if k > 0 {
			if serr := stream.Send(&corralv1.ReadFileResponse{Data: buf[:k]}); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func (s *Service) ListDir(ctx context.Context, req *connect.Request[corralv1.ListDirRequest]) (*connect.Response[corralv1.ListDirResponse], error) {
	n, err := s.route(req.Msg.SandboxId)
	if err != nil {
		return nil, err
	}
	infos, err := n.ListDir(ctx, req.Msg.SandboxId, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
	return connect.NewResponse(&corralv1.ListDirResponse{Entries: toProtos(infos, fileInfoToProto)}), nil
}

func (s *Service) Stat(ctx context.Context, req *connect.Request[corralv1.StatRequest]) (*connect.Response[corralv1.StatResponse], error) {
	n, err := s.route(req.Msg.SandboxId)
	if err != nil {
		return nil, err
	}
	fi, err := n.Stat(ctx, req.Msg.SandboxId, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.StatResponse{Info: fileInfoToProto(fi)}), nil
}

func (s *Service) Remove(ctx context.Context, req *connect.Request[corralv1.RemoveRequest]) (*connect.Response[corralv1.RemoveResponse], error) {
	n, err := s.route(req.Msg.SandboxId)
	if err != nil {
		return nil, err
	}
	if err := n.Remove(ctx, req.Msg.SandboxId, req.Msg.Path, req.Msg.Recursive); err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.RemoveResponse{}), nil
}

func (s *Service) MakeDir(ctx context.Context, req *connect.Request[corralv1.MakeDirRequest]) (*connect.Response[corralv1.MakeDirResponse], error) {
	m := req.Msg
	n, err := s.route(m.SandboxId)
	if err != nil {
		return nil, err
	}
	mode, err := modeFromProto("mode", m.Mode, 0o755)
	if err != nil {
		return nil, err
	}
	if err := n.MakeDir(ctx, m.SandboxId, m.Path, mode, m.Parents); err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.MakeDirResponse{}), nil
}

func (s *Service) Pause(ctx context.Context, req *connect.Request[corralv1.PauseRequest]) (*connect.Response[corralv1.PauseResponse], error) {
	n, err := s.route(req.Msg.Id)
	if err != nil {
		return nil, err
	}
	if req.Msg.Reclaim {
		r, err := n.PauseReclaim(ctx, req.Msg.Id)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(&corralv1.PauseResponse{
			ResidentBeforeBytes: r.Before.ResidentBytes, ResidentAfterBytes: r.After.ResidentBytes, SwappedBytes: r.After.SwappedBytes,
		}), nil
	}
	if err := n.Pause(ctx, req.Msg.Id); err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.PauseResponse{}), nil
}

func (s *Service) Resume(ctx context.Context, req *connect.Request[corralv1.ResumeRequest]) (*connect.Response[corralv1.ResumeResponse], error) {
	n, err := s.route(req.Msg.Id)
	if err != nil {
		return nil, err
	}
	if err := n.Resume(ctx, req.Msg.Id); err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.ResumeResponse{}), nil
}

func (s *Service) UpdateNetwork(ctx context.Context, req *connect.Request[corralv1.UpdateNetworkRequest]) (*connect.Response[corralv1.UpdateNetworkResponse], error) {
	m := req.Msg
	n, err := s.route(m.Id)
	if err != nil {
		return nil, err
	}
	mode, err := networkModeFromProto("mode", m.Mode)
	if err != nil {
		return nil, err
	}
	nw, err := n.UpdateNetwork(ctx, m.Id, node.NetworkUpdate{Mode: mode, Allow: m.Allow, Deny: m.Deny, Replace: m.Replace})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.UpdateNetworkResponse{Network: networkToProto(nw.Mode, nw.Allow)}), nil
}

func (s *Service) NetworkStats(ctx context.Context, req *connect.Request[corralv1.NetworkStatsRequest]) (*connect.Response[corralv1.NetworkStatsResponse], error) {
	n, err := s.route(req.Msg.Id)
	if err != nil {
		return nil, err
	}
	st, err := n.NetworkStats(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(statsToProto(st)), nil
}
