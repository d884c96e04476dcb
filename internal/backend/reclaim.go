package backend

import "context"

// Memory is where a sandbox's memory is now.
type Memory struct {
	ResidentBytes int64 // in RAM (page cache included)
	SwappedBytes  int64 // in the node's swap area
}

// Reclaimer is implemented by sandboxes whose memory can leave RAM while
// they are paused (pause --reclaim).
type Reclaimer interface {
	// Reclaim pushes a paused sandbox's memory out of RAM and says where
	// it was before and after. swap tells whether the node has a swap
	// area; a sandbox that needs one fails FailedPrecondition without it.
	Reclaim(ctx context.Context, swap bool) (before, after Memory, err error)
	// Memory reads where the sandbox's memory is now.
	Memory(ctx context.Context) (Memory, error)
}
