package cluster

import (
	"context"
	"fmt"
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
	a := r.a
	cost := a.cost(&corralv1.CreateRequest{Resources: req.Msg.Resources})
	a.mu.Lock()
	if err := a.admitLocked(cost); err != nil {
		a.mu.Unlock()
		return nil, fmt.Errorf("adopt sandbox %s: %w", req.Msg.SandboxId, err)
	}
	a.inflight.add(cost, 1)
	a.mu.Unlock()
	resp, err := r.MigrationServiceHandler.AdoptSnapshot(ctx, req)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inflight.add(cost, -1)
	if err == nil {
		sb := resp.Msg.GetSandbox()
		a.delta.add(cost, 1)
		a.delta.count(sb.GetBackend(), sb.GetLabels(), 1)
		a.delta.countProject(sb, 1)
	}
	return resp, err
}
