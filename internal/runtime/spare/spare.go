// Package spare starts idle OS threads ahead of need, for the node daemon
// (which may meet a host with no PID left) and for corral-init (whose
// serving stage should not create threads while it answers). It imports
// only the standard library, so the static sandbox-side binaries may link it.
package spare

import (
	"runtime"
	"sync"
)

// Threads makes the Go runtime start n OS threads and keeps them idle in
// its pool: each goroutine pins the thread it runs on until all are
// pinned, so the scheduler must start a new thread for the next one. Go
// never ends an idle thread, so later bursts reuse them instead of
// creating threads. It takes tens of microseconds, no sleeping.
func Threads(n int) {
	var pinned, release sync.WaitGroup
	release.Add(1)
	for range n {
		pinned.Add(1)
		go func() {
			runtime.LockOSThread()
			pinned.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	pinned.Wait()
	release.Done()
}
