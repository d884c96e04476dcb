package pidfd

import (
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestExited: a running child's pidfd says not exited, and says exited
// once the child has ended (before anyone reaps it).
func TestExited(t *testing.T) {
	fd := -1
	pid, err := syscall.ForkExec("/bin/sleep", []string{"sleep", "0.3"}, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{PidFD: &fd}})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	defer func() { _, _ = unix.Wait4(pid, nil, 0, nil) }()
	if fd < 0 {
		t.Skip("the kernel gives no pidfd (CLONE_PIDFD, Linux 5.2+)")
	}
	if Exited(fd) {
		t.Fatal("a running child's pidfd says exited")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !Exited(fd) {
		if time.Now().After(deadline) {
			t.Fatal("the child's pidfd says not exited 10 s after a 0.3 s sleep")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
