package initproc

import (
	"syscall"
	"testing"
	"time"
)

// TestAwaitExitByPidfd: a command's exit reaches its exec through the
// command's pidfd alone, with no SIGCHLD reaper running, status and all.
func TestAwaitExitByPidfd(t *testing.T) {
	s := &server{waiters: map[int]chan exitStatus{}}
	pidfd := -1
	attr := &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Setpgid: true, PidFD: &pidfd}}
	done := make(chan exitStatus, 1)
	s.mu.Lock()
	pid, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", "sleep 0.2; exit 3"}, attr)
	if err == nil {
		s.waiters[pid] = done
	}
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if pidfd < 0 {
		t.Skip("the kernel gives no pidfd (CLONE_PIDFD, Linux 5.2+): exits come by SIGCHLD only")
	}
	got := make(chan exitStatus, 1)
	go func() { got <- s.awaitExit(pidfd, done) }()
	select {
	case es := <-got:
		if !es.ws.Exited() || es.ws.ExitStatus() != 3 {
			t.Fatalf("status %v, want exit 3", es.ws)
		}
		if len(s.waiters) != 0 {
			t.Fatalf("waiters left: %v", s.waiters)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit 10 s after the command's: the pidfd did not wake the exec")
	}
}
