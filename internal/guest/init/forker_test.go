package initproc

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// Locked in init, TestMain runs on the thread group leader.
func init() { runtime.LockOSThread() }

// leaderForker is what TestMain found starting a forker on the leader.
var leaderForker error

func TestMain(m *testing.M) {
	leaderForker = forkerFromTheLeader()
	os.Exit(m.Run())
}

// forkerFromTheLeader starts a forker from a goroutine on the thread group
// leader, as a renew may, and says which thread was confined.
func forkerFromTheLeader() error {
	if unix.Gettid() != unix.Getpid() {
		return errors.New("TestMain does not run on the thread group leader")
	}
	confined := make(chan int, 1)
	confineThread = func([]byte) error {
		confined <- unix.Gettid()
		return errors.New("no view to confine to in a test")
	}
	defer func() { confineThread = confine }()
	f := &forker{reqs: make(chan func())}
	errc := make(chan error, 1)
	f.serve(nil, errc, nil)
	<-errc
	if tid := <-confined; tid == unix.Getpid() {
		return fmt.Errorf("the forker confined the thread group leader (tid %d)", tid)
	}
	if unix.Gettid() != unix.Getpid() {
		return errors.New("TestMain left the thread group leader")
	}
	return nil
}

// TestForkerNeverOnTheLeader: the leader's root is what /proc/<init>/root
// shows the node (its file API reaches the view through it), so a forker
// whose goroutine lands on the leader confines another thread.
func TestForkerNeverOnTheLeader(t *testing.T) {
	if leaderForker != nil {
		t.Fatal(leaderForker)
	}
}
