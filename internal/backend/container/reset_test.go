package container

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"golang.org/x/sys/unix"
)

func resettable(sp *backend.Spec) { sp.Resettable = true; sp.Resources.DiskBytes = 16 << 20 }

func reset(t *testing.T, s backend.Sandbox) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.(backend.Resetter).Reset(ctx, nil); err != nil {
		t.Fatalf("reset: %v", err)
	}
}

// TestResetIsolates: files (overlay, /tmp, /dev/shm), background processes
// and SysV IPC of one command are gone after a reset.
func TestResetIsolates(t *testing.T) {
	s := newSandbox(t, newBackend(t), resettable)
	r := sh(t, s, "echo hi > /tmp/x; echo y > /etc/y; rm /bin/ls; echo z > /dev/shm/z; (sleep 1000 &) ; ipctool make && test $(ipctool count) = 3 && cat /tmp/x")
	if r.stdout != "hi\n" || r.ExitCode != 0 {
		t.Fatalf("call 1: %+v", r)
	}
	reset(t, s)
	r = sh(t, s, "cat /tmp/x /etc/y /dev/shm/z 2>/dev/null; test -e /bin/ls && echo ls-back; ps -o comm | grep -c sleep; ipctool count")
	if r.stdout != "ls-back\n0\n0\n" {
		t.Fatalf("call 2 sees call 1: %q", r.stdout)
	}
	t.Logf("call 2: %q", r.stdout)
	// The file API sees the view.
	rc, err := s.ReadFile(context.Background(), "/etc/hostname", 0, 0)
	if err == nil {
		io.Copy(io.Discard, rc)
		rc.Close()
	}
	if _, err := s.Stat(context.Background(), "/bin/sh"); err != nil {
		t.Fatalf("stat through the file API: %v", err)
	}
}

// TestResetConfinement: commands cannot mount, chroot or see init's root.
func TestResetConfinement(t *testing.T) {
	s := newSandbox(t, newBackend(t), resettable)
	r := sh(t, s, "mkdir /m; mount -t tmpfs x /m 2>&1 && echo MOUNTED; chroot /tmp /bin/true 2>&1 && echo CHROOTED; ls /proc/1/root/ 2>&1; grep Cap /proc/self/status")
	if strings.Contains(r.stdout, "MOUNTED") || strings.Contains(r.stdout, "CHROOTED") || strings.Contains(r.stdout, "pool.json") {
		t.Fatalf("escaped confinement: %s", r.stdout)
	}
	t.Logf("%s", r.stdout)
	r = run1(t, s, backend.ExecSpec{Argv: []string{"sh", "-c", "while :; do :; done"}, CPULimit: time.Second, Timeout: 10 * time.Second})
	if r.TimedOut || r.Signal != int(unix.SIGXCPU) {
		t.Fatalf("cpu limit: %+v", r.ExecResult)
	}
}

// TestExecThenReset: an exec with ThenReset resets the sandbox before it
// returns (nothing the command started runs), the next Reset reports that
// reset, ResetKeep is spared, and an exec in between voids it.
func TestExecThenReset(t *testing.T) {
	b := newBackend(t)
	s := newSandbox(t, b, resettable)
	rs := s.(backend.Resetter)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	thenReset := func(script string, keep ...int) {
		t.Helper()
		r := run1(t, s, backend.ExecSpec{Argv: []string{"sh", "-c", script}, ThenReset: true, ResetKeep: keep})
		if r.ExitCode != 0 {
			t.Fatalf("%q: %+v", script, r)
		}
	}
	procs := func() int {
		t.Helper()
		pids, err := s.(*sandbox).group.Procs()
		if err != nil {
			t.Fatal(err)
		}
		return len(pids)
	}

	// A file written and a process left behind: gone when Exec returns.
	thenReset("echo hi > /tmp/x; sleep 1000 >/dev/null 2>&1 &")
	if n := procs(); n != 1 {
		t.Fatalf("%d processes in the sandbox once the exec with ThenReset returned, want init alone", n)
	}
	if dirty, err := rs.Reset(ctx, nil); err != nil || !dirty {
		t.Fatalf("Reset after a command that wrote a file: dirty %v, %v; want true", dirty, err)
	}
	if r := sh(t, s, "cat /tmp/x 2>/dev/null; echo end"); r.stdout != "end\n" {
		t.Fatalf("after the reset: %q", r.stdout)
	}

	// A kept process survives; a clean command leaves the view clean.
	r := sh(t, s, "sleep 1000 >/dev/null 2>&1 & echo $!")
	var pid int
	if _, err := fmt.Sscan(r.stdout, &pid); err != nil {
		t.Fatalf("background pid: %q: %v", r.stdout, err)
	}
	thenReset("true", pid)
	if n := procs(); n != 2 {
		t.Fatalf("%d processes after a reset sparing one, want init and it", n)
	}
	if dirty, err := rs.Reset(ctx, []int{pid}); err != nil || dirty {
		t.Fatalf("Reset after a command that wrote nothing: dirty %v, %v; want false", dirty, err)
	}

	// An exec between the two: Reset resets again.
	thenReset("true", pid)
	sh(t, s, "echo y > /tmp/y")
	if dirty, err := rs.Reset(ctx, nil); err != nil || !dirty {
		t.Fatalf("Reset after an exec that wrote a file: dirty %v, %v; want true", dirty, err)
	}

	// A sandbox that cannot be reset refuses the flag.
	plain := newSandbox(t, b, nil)
	_, err := plain.Exec(ctx, backend.ExecSpec{Argv: []string{"true"}, ThenReset: true}, nil)
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("ThenReset on a sandbox that is not resettable: %v, want invalid argument", err)
	}
}

// TestExecConnectionReuse: a sandbox's execs take turns on one connection
// to init (protocol 14), pooled or not. An exec after one that timed out
// (its kill sent on that connection), or after one whose process handle is
// signalled once it returned, runs undisturbed; execs at once each have
// their own connection.
func TestExecConnectionReuse(t *testing.T) {
	cases := []struct {
		name string
		b    *Backend
		opt  func(*backend.Spec)
		kept bool
	}{
		{"stub", newBackend(t), nil, false}, // its server lingers 2 s and exits
		{"plain", newDiskBackend(t), withDisk(8*mib, 1000), true},
		{"pooled", newBackend(t), resettable, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSandbox(t, c.b, c.opt)
			checkConnKept(t, s, c.kept)
			testExecConnectionReuse(t, s)
		})
	}
}

func testExecConnectionReuse(t *testing.T, s backend.Sandbox) {
	r := run1(t, s, backend.ExecSpec{Argv: []string{"sleep", "5"}, Timeout: 100 * time.Millisecond})
	if !r.TimedOut {
		t.Fatalf("sleep 5 with a 100 ms timeout: %+v", r)
	}
	if r := sh(t, s, "sleep 0.3; echo ok"); r.stdout != "ok\n" || r.ExitCode != 0 {
		t.Fatalf("the exec after a timed-out one: %+v", r)
	}

	var proc backend.Process
	run1(t, s, backend.ExecSpec{Argv: []string{"true"}, Started: func(p backend.Process) { proc = p }})
	if proc == nil {
		t.Fatal("Started was not called")
	}
	done := make(chan result, 1)
	go func() { done <- sh(t, s, "sleep 0.5; echo ok") }()
	time.Sleep(100 * time.Millisecond)
	if err := proc.Signal(int(unix.SIGKILL)); err == nil {
		t.Error("signalling the process of an exec that returned: no error")
	}
	if r := <-done; r.stdout != "ok\n" || r.ExitCode != 0 {
		t.Fatalf("an exec while an earlier exec's process handle was signalled: %+v", r)
	}

	results := make(chan result, 3)
	for i := range 3 {
		go func() { results <- sh(t, s, fmt.Sprintf("sleep 0.3; echo %d", i)) }()
	}
	seen := map[string]bool{}
	for range 3 {
		r := <-results
		if r.ExitCode != 0 {
			t.Fatalf("concurrent exec: %+v", r)
		}
		seen[r.stdout] = true
	}
	if len(seen) != 3 {
		t.Fatalf("three concurrent execs answered %v", seen)
	}
}

// checkConnKept runs `true` three times one after the other and checks
// whether init served them all on the sockets it had after the first (a
// kept connection). Socket inode numbers are never reused, and a client
// that does not keep connections dials a new one for every exec.
func checkConnKept(t *testing.T, s backend.Sandbox, kept bool) {
	t.Helper()
	run1(t, s, backend.ExecSpec{Argv: []string{"true"}})
	before := initSockets(t, s)
	for range 2 {
		run1(t, s, backend.ExecSpec{Argv: []string{"true"}})
	}
	if after := initSockets(t, s); maps.Equal(before, after) != kept {
		t.Fatalf("init's sockets over two execs (want the connection kept: %v): %v, then %v", kept, slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
	}
}

// initSockets returns the socket inodes of the sandbox's PID 1.
func initSockets(t *testing.T, s backend.Sandbox) map[string]bool {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", s.(*sandbox).proc.Pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	socks := map[string]bool{}
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			socks[l] = true
		}
	}
	return socks
}
