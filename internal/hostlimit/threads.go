package hostlimit

import (
	"runtime"
	"sync"
)

// SpareThreads makes the Go runtime start n OS threads and keeps them idle
// in its pool: each goroutine pins the thread it runs on until all are
// pinned, so the scheduler must start a new thread for the next one. Go
// never ends an idle thread, so later bursts reuse them instead of
// creating threads when the host may have no PID left.
func SpareThreads(n int) {
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
