package cgroup

import (
	"bufio"
	"context"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"
)

// watchedGroup makes a group for the test, removed at its end, and a Watch
// of it, closed before that.
func watchedGroup(t *testing.T, name string, lim Limits) (*Group, *Watch) {
	t.Helper()
	g, err := testManager(t).Create(name, lim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Not t.Context(): it is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Remove(ctx)
	})
	w, err := g.Watch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return g, w
}

// TestWatchReadsAfresh: the files a Watch holds open answer each read with
// the group's state at that moment, not the state of their first read —
// a process that joins shows in Procs and its CPU in CPUUsage, one that
// has exited is gone from Procs.
func TestWatchReadsAfresh(t *testing.T) {
	g, w := watchedGroup(t, "sb.watch", Limits{Pids: 16})
	if pids, err := w.Procs(); err != nil || len(pids) != 0 {
		t.Fatalf("empty group: Procs = %v %v", pids, err)
	}
	cpu0, err := w.CPUUsage()
	if err != nil {
		t.Fatal(err)
	}

	spin := exec.Command("/bin/sh", "-c", "while :; do :; done")
	if err := spin.Start(); err != nil {
		t.Fatal(err)
	}
	defer spin.Process.Kill()
	if err := g.AddProc(spin.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if pids, err := w.Procs(); err != nil || !slices.Equal(pids, []int{spin.Process.Pid}) {
		t.Fatalf("after a process joined: Procs = %v %v, want [%d]", pids, err, spin.Process.Pid)
	}
	time.Sleep(200 * time.Millisecond)
	spin.Process.Kill()
	spin.Wait()
	if pids, err := w.Procs(); err != nil || len(pids) != 0 {
		t.Fatalf("after it exited: Procs = %v %v, want none", pids, err)
	}
	cpu1, err := w.CPUUsage()
	if err != nil {
		t.Fatal(err)
	}
	if direct, err := g.CPUUsage(); err != nil || cpu1 != direct {
		t.Errorf("CPUUsage %v through the held file, %v %v read afresh", cpu1, direct, err)
	}
	if cpu1-cpu0 < 50*time.Millisecond {
		t.Errorf("CPUUsage went from %v to %v over 200ms of a spinning process", cpu0, cpu1)
	}
}

// TestWatchReadsLongProcs: a cgroup.procs longer than the Watch's first
// buffer and than one page of the kernel's (a read stops short of the
// end there) still comes back whole, every pid of the group.
func TestWatchReadsLongProcs(t *testing.T) {
	const n = 900 // at 6-7 bytes a pid, more than 4 KiB
	g, w := watchedGroup(t, "sb.watchlong", Limits{Pids: n + 16})
	if g.V2Path() == "" {
		t.Skip("no v2 group: Procs reads cgroup.procs afresh, not through the Watch")
	}
	sh := exec.Command("/bin/sh", "-c", "read go; for i in $(seq "+strconv.Itoa(n)+"); do sleep 60 & done; echo started; wait")
	in, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	defer sh.Wait()
	defer g.Kill(context.Background())
	if err := g.AddProc(sh.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if b, err := bufio.NewReader(out).ReadString('\n'); err != nil || b != "started\n" {
		t.Fatalf("sh: %q %v", b, err)
	}
	pids, err := w.Procs()
	if err != nil {
		t.Fatal(err)
	}
	direct, err := g.Procs()
	if err != nil {
		t.Fatal(err)
	}
	if len(pids) != n+1 || !slices.Equal(pids, direct) {
		t.Fatalf("Procs through the Watch: %d pids, want %d, the same as read afresh (%d)", len(pids), n+1, len(direct))
	}
}
