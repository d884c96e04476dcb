package client

import (
	"context"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// Migration is what moving a sandbox to another node did.
type Migration struct {
	// Sandbox is the sandbox on its new node (same id).
	Sandbox    *Info
	SourceNode string
	// BytesCopied are the snapshot's data bytes sent between the nodes.
	BytesCopied int64
	// How long each step took, and the whole call.
	SnapshotTime, CopyTime, RestoreTime, Total time.Duration
	// Warning is set when the original could not be deleted after the
	// switch (the sandbox runs on the new node all the same).
	Warning string
}

// Migrate moves the sandbox to node (a node id of the cluster) under the
// same id: its memory, processes and files go on there, and every call
// with the id reaches the new node. Through a cluster's control plane
// only, as its administrator; microVMs only (containers fail
// Unimplemented: live checkpoints need CRIU).
func (s *Sandbox) Migrate(ctx context.Context, node string) (*Migration, error) {
	resp, err := s.c.mig.Migrate(ctx, connect.NewRequest(&corralv1.MigrateRequest{SandboxId: s.id, TargetNode: node}))
	if err != nil {
		return nil, wrapErr(err)
	}
	m := resp.Msg
	return &Migration{Sandbox: infoFromProto(m.Sandbox), SourceNode: m.SourceNode, BytesCopied: m.BytesCopied,
		SnapshotTime: m.SnapshotTime.AsDuration(), CopyTime: m.CopyTime.AsDuration(), RestoreTime: m.RestoreTime.AsDuration(),
		Total: m.TotalTime.AsDuration(), Warning: m.Warning}, nil
}
