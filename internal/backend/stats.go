package backend

import (
	"context"
	"time"
)

// Stats are a sandbox's resource figures at one moment.
type Stats struct {
	// CPUTime is the CPU time of every process so far.
	CPUTime     time.Duration
	MemoryBytes int64
	// DiskBytes is the writable layer's use (0 when the store cannot say).
	DiskBytes int64
	Pids      int64
	// NetRxBytes and NetTxBytes count the sandbox's interfaces but loopback.
	NetRxBytes, NetTxBytes uint64
	// OOMKills counts the OOM kills in the sandbox so far.
	OOMKills uint64
}

// StatsReader is implemented by sandboxes that can report their resource
// figures. Reading them neither resumes a paused sandbox nor counts as
// activity.
type StatsReader interface {
	Stats(ctx context.Context) (Stats, error)
}

// Checkpointer is implemented by sandboxes whose state can sit on disk
// while paused (a microVM's memory and device state after
// --microvm-snapshot-after).
type Checkpointer interface {
	// Checkpointed reports that the sandbox's state is on disk now and no
	// process of it runs.
	Checkpointed() bool
}
