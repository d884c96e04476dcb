package osthread

import (
	"os"
	"runtime"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// The test binary's main goroutine holds the thread group leader (locked
// here, in init), so no goroutine of a test ever gets it: the work below
// could not otherwise be kept from changing what /proc/self shows.
func init() { runtime.LockOSThread() }

// TestAvoidsThread: work that moves its thread into a mount namespace of
// its own runs on another thread than the avoided one (in production the
// thread group leader; here whichever thread comes first), and leaves
// that thread in the process's namespace.
func TestAvoidsThread(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to unshare a mount namespace")
	}
	before, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		avoided, ran := -1, -1
		var inside string
		errc := make(chan error, 1)
		goAvoiding(func(tid int) bool {
			avoided = tid
			return true
		}, func() {
			ran = unix.Gettid()
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				errc <- err
				return
			}
			var err error
			inside, err = os.Readlink("/proc/thread-self/ns/mnt")
			errc <- err
		})
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if inside == before {
			t.Fatal("the work did not get a namespace of its own")
		}
		if ran == avoided {
			t.Fatalf("work ran on the avoided thread %d", avoided)
		}
		ns, err := os.Readlink("/proc/self/task/" + strconv.Itoa(avoided) + "/ns/mnt")
		if err != nil || ns != before {
			t.Fatalf("the avoided thread is in %q (%v), want %s", ns, err, before)
		}
		if now, _ := os.Readlink("/proc/self/ns/mnt"); now != before {
			t.Fatalf("the leader is now in %s (was %s)", now, before)
		}
	}
	if !isLeader(unix.Getpid()) || isLeader(unix.Gettid()) {
		t.Error("isLeader does not tell the leader (the main goroutine's thread) from this one")
	}
}
