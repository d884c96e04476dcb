package cluster

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
)

// Migrations is a control instance's MigrationService: Migrate drives the
// steps on the nodes (their MigrationService on the cluster listener).
// The node-side steps are not served here (Unimplemented): a caller of
// the control plane never names snapshot files.
type Migrations struct {
	corralv1connect.UnimplementedMigrationServiceHandler
	P *Proxy
}

var _ corralv1connect.MigrationServiceHandler = Migrations{}

// switchTimeout bounds the wait for this instance's watcher to route the
// sandbox to its new node.
const switchTimeout = 10 * time.Second

// fenceLapse is how long the source stays fenced without the switch: a
// control instance that dies mid-migration leaves the original paused
// for at most this long.
const fenceLapse = 10 * time.Minute

// Migrate moves a sandbox to another node under the same id: it is
// admitted on the target (its capacity; the project's quota does not
// change, the sandbox only moves), snapshotted on its node, the snapshot
// streamed from node to node through this instance, restored on the
// target under the same id, the route switched, and the original deleted.
// The original is fenced from its snapshot on (paused; calls to it on
// its node are refused UNAVAILABLE), so nothing it does after the
// snapshot is lost. Until the switch any failure lifts the fence, leaving
// the original running, and nothing on the target (its import and
// restore undo themselves; the source's snapshot is always removed).
func (m Migrations) Migrate(ctx context.Context, req *connect.Request[corralv1.MigrateRequest]) (*connect.Response[corralv1.MigrateResponse], error) {
	start := time.Now()
	p, id, target := m.P, req.Msg.SandboxId, req.Msg.TargetNode
	switch {
	case id == "":
		return nil, errdefs.InvalidArgument("sandbox_id: required")
	case target == "":
		return nil, errdefs.InvalidArgument("target_node: required (a node id, see `corral nodes`)")
	}
	src, c, err := p.nodeFor(id)
	if err != nil {
		return nil, err
	}
	got, err := c.Get(ctx, connect.NewRequest(&corralv1.GetRequest{Id: id}))
	if err != nil {
		return nil, unreachable(src, err)
	}
	sb := got.Msg.GetSandbox()
	dst := p.cfg.Watcher.Snapshot().Node(target)
	switch {
	case dst == nil:
		return nil, errdefs.InvalidArgument("target_node: no node %q in the cluster", truncateID(target))
	case dst.ID == src.ID:
		return nil, errdefs.FailedPrecondition("target_node: sandbox %s is already on node %s", id, target)
	case dst.State == NodeLost:
		return nil, errdefs.Unavailable("target_node: %s", dst.Reason)
	}
	res := sb.GetResources()
	pls, err := p.cfg.Placer.Reserve(dst.ID, Want{Backend: sb.GetBackend(), CPUMillis: res.GetCpuMillis(),
		MemoryBytes: res.GetMemoryBytes(), DiskBytes: res.GetDiskBytes()}, 1)
	if len(pls) == 0 {
		return nil, fmt.Errorf("target_node %s: %w", target, err)
	}
	admitted := false
	defer func() { pls[0].Done(admitted) }()

	// From the fence on, the original is paused and refuses calls: what
	// the target resumes from is all there is. Every failure before the
	// switch lifts the fence, and the original runs on.
	snap, err := p.nodeClient(src).migration.FenceSnapshot(ctx, connect.NewRequest(&corralv1.FenceSnapshotRequest{
		SandboxId: id, TargetNode: dst.ID, Lapse: durationpb.New(fenceLapse)}))
	if err != nil {
		return nil, unreachable(src, err)
	}
	switched := false
	defer func() {
		if switched {
			return
		}
		if _, err := p.nodeClient(src).migration.LiftFence(context.WithoutCancel(ctx), connect.NewRequest(&corralv1.FenceRequest{SandboxId: id})); err != nil {
			p.cfg.Logger.Error("lift a failed migration's fence; it lapses on its own", "node", src.ID, "sandbox", id, "lapse", fenceLapse, "err", err)
		}
	}()
	snapID := snap.Msg.GetSnapshot().GetId()
	defer func() {
		// The source's snapshot was the migration's only: it goes either way.
		_, err := p.nodeClient(src).rollout.DeleteSnapshot(context.WithoutCancel(ctx), connect.NewRequest(&corralv1.DeleteSnapshotRequest{SnapshotId: snapID}))
		if err != nil {
			p.cfg.Logger.Error("remove a migration's snapshot", "node", src.ID, "snapshot", snapID, "err", err)
		}
	}()
	took := map[string]time.Duration{"snapshot": time.Since(start)}

	t := time.Now()
	copied, imported, err := m.copySnapshot(ctx, src, dst, snapID)
	if err != nil {
		return nil, err
	}
	took["copy"] = time.Since(t)

	t = time.Now()
	adopted, err := p.nodeClient(dst).migration.AdoptSnapshot(ctx, connect.NewRequest(&corralv1.AdoptSnapshotRequest{
		SnapshotId: imported, SandboxId: id, Resources: res}))
	if err != nil {
		return nil, unreachable(dst, err)
	}
	took["restore"] = time.Since(t)
	admitted = true

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), switchTimeout)
	defer cancel()
	// A fence that lapsed let the original run on: no switch then.
	_, err = p.nodeClient(src).migration.HoldFence(sctx, connect.NewRequest(&corralv1.FenceRequest{SandboxId: id}))
	if err == nil {
		err = p.cfg.Watcher.Move(sctx, id, dst.ID)
	} else {
		err = unreachable(src, err)
	}
	if err != nil {
		// The copy must not run beside the original: it goes, the
		// original stays where its route points.
		admitted = false
		if _, derr := p.client(dst).Delete(sctx, connect.NewRequest(&corralv1.DeleteRequest{Id: id})); derr != nil {
			p.cfg.Logger.Error("remove a migrated copy after a failed switch", "node", dst.ID, "sandbox", id, "err", derr)
		}
		return nil, fmt.Errorf("migrate sandbox %s: %w", id, err)
	}
	switched = true
	out := &corralv1.MigrateResponse{Sandbox: adopted.Msg.GetSandbox(), SourceNode: src.ID, BytesCopied: copied}
	resp, err := p.client(src).Delete(sctx, connect.NewRequest(&corralv1.DeleteRequest{Id: id}))
	if err != nil {
		out.Warning = fmt.Sprintf("the original on node %s was not deleted: %v", src.ID, err)
		p.cfg.Logger.Error("delete a migrated sandbox's original", "node", src.ID, "sandbox", id, "err", err)
	} else if f, ok := decodeFreed(resp.Header().Get(freedHeader)); ok {
		p.cfg.Placer.Freed(src.ID, f.Project, f.Usage)
	}
	out.SnapshotTime, out.CopyTime, out.RestoreTime = durationpb.New(took["snapshot"]), durationpb.New(took["copy"]), durationpb.New(took["restore"])
	out.TotalTime = durationpb.New(time.Since(start))
	p.cfg.Logger.Info("sandbox migrated", "sandbox", id, "from", src.ID, "to", dst.ID, "bytes", copied, "took", time.Since(start))
	return connect.NewResponse(out), nil
}

// copySnapshot streams snapshot snapID from src's export into an import on
// dst and returns the data bytes sent and the imported snapshot's id. A
// broken export cancels the import, so dst removes what it wrote.
func (m Migrations) copySnapshot(ctx context.Context, src, dst *NodeView, snapID string) (int64, string, error) {
	p := m.P
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in, err := p.nodeClient(src).migration.ExportSnapshot(ctx, connect.NewRequest(&corralv1.ExportSnapshotRequest{SnapshotId: snapID}))
	if err != nil {
		return 0, "", fmt.Errorf("export from node %s: %w", src.ID, unreachable(src, err))
	}
	defer in.Close()
	out := p.nodeClient(dst).migration.ImportSnapshot(ctx)
	var (
		copied  int64
		sendErr error
	)
	for in.Receive() {
		copied += int64(len(in.Msg().Data))
		if sendErr = out.Send(in.Msg()); sendErr != nil {
			break // the import's own error comes with CloseAndReceive
		}
	}
	if err := in.Err(); err != nil && sendErr == nil {
		cancel()
		_, _ = out.CloseAndReceive()
		return 0, "", fmt.Errorf("export from node %s: %w", src.ID, unreachable(src, err))
	}
	resp, err := out.CloseAndReceive()
	if err != nil {
		return 0, "", fmt.Errorf("import on node %s: %w", dst.ID, unreachable(dst, err))
	}
	return copied, resp.Msg.GetSnapshot().GetId(), nil
}

// truncateID bounds a caller's string quoted in an error.
func truncateID(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
