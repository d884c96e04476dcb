package backend

import "context"

// Snapshotter is implemented by sandboxes whose whole state (memory,
// devices and writable disk) can be saved while they keep running.
type Snapshotter interface {
	// SnapshotTo writes the snapshot into dir (an empty directory the
	// caller made and removes on failure) and returns the bytes it
	// occupies on disk. The sandbox runs on afterwards.
	SnapshotTo(ctx context.Context, dir string) (bytes int64, err error)
}

// Restorer is implemented by backends that make a new sandbox from a
// snapshot dir written by one of their Snapshotters. The new sandbox gets
// spec's identity (id, fresh agent secret, hostname, network slot); the
// snapshot dir is only read, so it can be restored again.
type Restorer interface {
	Restore(ctx context.Context, spec Spec, dir string) (Sandbox, error)
}
