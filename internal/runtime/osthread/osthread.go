// Package osthread runs work on an OS thread of its own: a goroutine
// locked to its thread for good, so that whatever the work changes in the
// thread (namespaces, root, credentials, capabilities, seccomp filters)
// never serves another goroutine, and Go ends the thread when the work
// returns. The thread is never the thread group leader: Go parks the
// leader instead of ending it, and the leader is what /proc/self shows the
// process and /proc/<pid> shows others (a node reaches a sandbox's files
// through its init's /proc/<pid>/root). It imports only the standard
// library and x/sys, so the static sandbox-side binaries may link it.
package osthread

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Go starts work on a thread of its own and returns at once.
func Go(work func()) { goAvoiding(isLeader, work) }

// Run runs work on a thread of its own and returns its error.
func Run(work func() error) error {
	errc := make(chan error, 1)
	Go(func() { errc <- work() })
	return <-errc
}

func isLeader(tid int) bool { return tid == unix.Getpid() }

// goAvoiding is Go with the thread to keep work off named by avoid: a
// goroutine that got such a thread holds it locked until a goroutine it
// starts has locked another (the avoided one, held, cannot run it), then
// hands it back unchanged.
func goAvoiding(avoid func(tid int) bool, work func()) {
	go func() {
		runtime.LockOSThread() // never unlocked but below: the thread ends with the goroutine
		if !avoid(unix.Gettid()) {
			work()
			return
		}
		locked := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(locked)
			work()
		}()
		<-locked
		runtime.UnlockOSThread()
	}()
}
