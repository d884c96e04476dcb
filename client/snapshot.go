package client

import (
	"context"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// Snapshot is a saved state of a sandbox (memory, devices and writable
// disk) on its node, restorable into new sandboxes until deleted.
type Snapshot struct {
	ID        string
	SandboxID string
	Backend   string
	Project   string
	// Bytes it occupies on the node's disk.
	Bytes   int64
	Created time.Time
}

func snapshotFromProto(p *corralv1.Snapshot) *Snapshot {
	return &Snapshot{ID: p.Id, SandboxID: p.SandboxId, Backend: p.Backend, Project: p.Project,
		Bytes: p.Bytes, Created: p.Created.AsTime()}
}

// Snapshot saves the sandbox's state while it keeps running (microVMs;
// containers fail with IsNotSupported naming why).
func (s *Sandbox) Snapshot(ctx context.Context) (*Snapshot, error) {
	resp, err := s.c.roll.Snapshot(ctx, connect.NewRequest(&corralv1.SnapshotRequest{SandboxId: s.id}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return snapshotFromProto(resp.Msg.Snapshot), nil
}

// Restore makes a new sandbox from snapshot id, continuing its processes
// with a fresh identity; labels are laid over the source's.
func (c *Client) Restore(ctx context.Context, id string, labels map[string]string) (*Sandbox, *Info, error) {
	resp, err := c.roll.Restore(ctx, connect.NewRequest(&corralv1.RestoreRequest{SnapshotId: id, Labels: labels}))
	if err != nil {
		return nil, nil, wrapErr(err)
	}
	return c.Sandbox(resp.Msg.Sandbox.Id), infoFromProto(resp.Msg.Sandbox), nil
}

// ListSnapshots lists the snapshots the caller may see, oldest first.
// Through a cluster whose nodes did not all answer it returns those it got
// and an Unavailable error naming the others.
func (c *Client) ListSnapshots(ctx context.Context) ([]*Snapshot, error) {
	resp, err := c.roll.ListSnapshots(ctx, connect.NewRequest(&corralv1.ListSnapshotsRequest{}))
	if err != nil {
		return nil, wrapErr(err)
	}
	out := fromProtos(resp.Msg.Snapshots, snapshotFromProto)
	if nf := resp.Msg.NodeFailures; len(nf) > 0 {
		// Through a cluster: the list lacks these nodes' snapshots.
		var why []string
		for _, f := range nf {
			why = append(why, f.NodeId+": "+f.Error)
		}
		return out, wrapErr(connect.NewError(connect.CodeUnavailable, fmt.Errorf("snapshots of %d node(s) missing: %s", len(nf), strings.Join(why, "; "))))
	}
	return out, nil
}

// DeleteSnapshot removes a snapshot; sandboxes restored from it stay.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	_, err := c.roll.DeleteSnapshot(ctx, connect.NewRequest(&corralv1.DeleteSnapshotRequest{SnapshotId: id}))
	return wrapErr(err)
}
