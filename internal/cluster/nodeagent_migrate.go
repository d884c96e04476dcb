package cluster

import (
	"context"
	"net/http"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
)

// MigrationHandler serves the node's side of migrations (inner) for
// control instances, only calls signed with the cluster secret. A
// migrated sandbox arriving here (AdoptSnapshot) is admitted against the
// node's capacity as a create is, and counted in its load at once.
func (a *NodeAgent) MigrationHandler(inner corralv1connect.MigrationServiceHandler, secret Secret, opts ...connect.HandlerOption) (string, http.Handler) {
	path, h := corralv1connect.NewMigrationServiceHandler(agentMigrations{MigrationServiceHandler: inner, a: a}, opts...)
	return path, RequireSigned(secret, h)
}

type agentMigrations struct {
	corralv1connect.MigrationServiceHandler
	a *NodeAgent
}

func (r agentMigrations) AdoptSnapshot(ctx context.Context, req *connect.Request[corralv1.AdoptSnapshotRequest]) (*connect.Response[corralv1.AdoptSnapshotResponse], error) {
	var resp *connect.Response[corralv1.AdoptSnapshotResponse]
	err := r.a.admitOne(r.a.cost(&corralv1.CreateRequest{Resources: req.Msg.Resources}), "adopt sandbox "+req.Msg.SandboxId, func() (*corralv1.Sandbox, error) {
		var err error
		if resp, err = r.MigrationServiceHandler.AdoptSnapshot(ctx, req); err != nil {
			return nil, err
		}
		return resp.Msg.GetSandbox(), nil
	})
	return resp, err
}
