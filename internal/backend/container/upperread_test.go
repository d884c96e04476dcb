package container

import (
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOnThreadAvoidsThread: work that moves its thread into a mount
// namespace of its own runs on another thread than the avoided one (in
// production the process's main thread, which never ends), and that
// thread stays in the process's namespace.
func TestOnThreadAvoidsThread(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to unshare a mount namespace")
	}
	before, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	for _, force := range []bool{false, true} {
		avoided, ran := -1, -1
		var inside string
		err := onThreadAvoiding(func(tid int) bool {
			if force {
				avoided = tid
			}
			return force
		}, func() error {
			ran = unix.Gettid()
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return err
			}
			inside, err = os.Readlink("/proc/thread-self/ns/mnt")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if inside == before {
			t.Fatalf("force %v: the work did not get a namespace of its own", force)
		}
		if force && ran == avoided {
			t.Fatalf("work ran on the avoided thread %d", avoided)
		}
		if force {
			ns, err := os.Readlink("/proc/self/task/" + strconv.Itoa(avoided) + "/ns/mnt")
			if err != nil || ns != before {
				t.Fatalf("the avoided thread is in %q (%v), want %s", ns, err, before)
			}
		}
		if now, _ := os.Readlink("/proc/self/ns/mnt"); now != before {
			t.Fatalf("force %v: the main thread is now in %s (was %s)", force, now, before)
		}
	}
}
