package control

import (
	"context"
	"io"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/node"
)

// MigrationService is a node's side of a migration: the steps a control
// instance drives (fence and snapshot, export, import, adopt, hold or
// lift the fence). It is served on the node's cluster listener only,
// behind the cluster secret; the node's own API does not serve it.
type MigrationService struct {
	sandboxes *Service
}

var _ corralv1connect.MigrationServiceHandler = (*MigrationService)(nil)

// NewMigrationService serves the local node of sandboxes.
func NewMigrationService(sandboxes *Service) *MigrationService {
	return &MigrationService{sandboxes: sandboxes}
}

// Migrate is the control plane's: a node alone has nowhere to move to.
func (m *MigrationService) Migrate(context.Context, *connect.Request[corralv1.MigrateRequest]) (*connect.Response[corralv1.MigrateResponse], error) {
	return nil, errdefs.FailedPrecondition("migrate: send it to a control instance of the cluster (corral serve --role control); a node serves only its steps")
}

func (m *MigrationService) ExportSnapshot(ctx context.Context, req *connect.Request[corralv1.ExportSnapshotRequest], stream *connect.ServerStream[corralv1.SnapshotChunk]) error {
	return m.sandboxes.local.ExportSnapshot(ctx, req.Msg.SnapshotId, func(c node.SnapshotChunk) error {
		return stream.Send(&corralv1.SnapshotChunk{Name: c.Name, Size: c.Size, Offset: c.Offset, Data: c.Data})
	})
}

func (m *MigrationService) ImportSnapshot(ctx context.Context, stream *connect.ClientStream[corralv1.SnapshotChunk]) (*connect.Response[corralv1.ImportSnapshotResponse], error) {
	info, err := m.sandboxes.local.ImportSnapshot(ctx, func() (node.SnapshotChunk, error) {
		if !stream.Receive() {
			if err := stream.Err(); err != nil {
				return node.SnapshotChunk{}, err
			}
			return node.SnapshotChunk{}, io.EOF
		}
		c := stream.Msg()
		return node.SnapshotChunk{Name: c.Name, Size: c.Size, Offset: c.Offset, Data: c.Data}, nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.ImportSnapshotResponse{Snapshot: snapshotToProto(info)}), nil
}

func (m *MigrationService) AdoptSnapshot(ctx context.Context, req *connect.Request[corralv1.AdoptSnapshotRequest]) (*connect.Response[corralv1.AdoptSnapshotResponse], error) {
	sb, err := m.sandboxes.local.AdoptSnapshot(ctx, req.Msg.SnapshotId, req.Msg.SandboxId)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.AdoptSnapshotResponse{Sandbox: sandboxToProto(sb)}), nil
}

func (m *MigrationService) FenceSnapshot(ctx context.Context, req *connect.Request[corralv1.FenceSnapshotRequest]) (*connect.Response[corralv1.FenceSnapshotResponse], error) {
	info, err := m.sandboxes.local.SnapshotFenced(ctx, req.Msg.SandboxId, req.Msg.TargetNode, req.Msg.GetLapse().AsDuration())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.FenceSnapshotResponse{Snapshot: snapshotToProto(info)}), nil
}

func (m *MigrationService) HoldFence(ctx context.Context, req *connect.Request[corralv1.FenceRequest]) (*connect.Response[corralv1.FenceResponse], error) {
	if err := m.sandboxes.local.HoldFence(ctx, req.Msg.SandboxId); err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.FenceResponse{}), nil
}

func (m *MigrationService) LiftFence(ctx context.Context, req *connect.Request[corralv1.FenceRequest]) (*connect.Response[corralv1.FenceResponse], error) {
	if err := m.sandboxes.local.LiftFence(ctx, req.Msg.SandboxId); err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.FenceResponse{}), nil
}
