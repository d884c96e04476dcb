package container

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

// recyclable is a recyclable sandbox's spec on the ext4-image store.
func recyclable(sp *backend.Spec) {
	sp.Recyclable = true
	withDisk(64*mib, 16384)(sp)
}

// recycle runs a deleted sandbox's Scrub then Renew, as the node does, and
// reports whether Scrub found its files written to.
func recycle(t *testing.T, s backend.Sandbox) (dirty bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := s.(backend.Recycler)
	if err := r.Scrub(ctx); err != nil {
		t.Fatalf("scrub: %v", err)
	}
	c := s.(*sandbox)
	if procs, err := c.group.Procs(); err != nil || len(procs) != 1 || procs[0] != c.proc.Pid {
		t.Fatalf("after scrub the cgroup holds %v (err %v), want init %d alone", procs, err, c.proc.Pid)
	}
	dirty = c.pool.dirty
	if err := r.Renew(ctx); err != nil {
		t.Fatalf("renew: %v", err)
	}
	return dirty
}

// imageFile identifies sandbox id's disk image file (inode and change time,
// as a freed inode number may come back): a fresh disk is a new file.
func imageFile(t *testing.T, id string) [3]int64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(diskDir(), id+".img"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return [3]int64{int64(st.Ino), st.Ctim.Sec, st.Ctim.Nsec}
}

// TestRecycleLeavesNothingOfTheLastTenant: what one tenant of a recyclable
// sandbox left (files on its disk and in /dev and /dev/shm, a background
// process, SysV IPC, a POSIX message queue, a high PID counter, CPU time)
// is gone for the next, which gets a fresh disk; a tenant that wrote
// nothing keeps the disk.
func TestRecycleLeavesNothingOfTheLastTenant(t *testing.T) {
	b := newDiskBackend(t)
	s := newSandbox(t, b, recyclable)
	first := imageFile(t, s.ID())
	r := sh(t, s, "echo secret > /root/answer; echo x > /tmp/x; rm /bin/ls; echo z > /dev/shm/z; touch /dev/extra;"+
		" setsid sleep 1000 & ipctool make && ipctool mqmake q1 && for i in $(seq 60); do /bin/true; done;"+
		" dd if=/dev/zero of=/root/fill bs=1M count=8 2>/dev/null; sh -c 'echo $$'")
	if r.ExitCode != 0 {
		t.Fatalf("tenant 1: %+v", r)
	}
	pid1, _ := strconv.Atoi(strings.TrimSpace(r.stdout)) // past 60 forks
	st1, err := s.(backend.StatsReader).Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !recycle(t, s) {
		t.Fatal("scrub found the disk clean after tenant 1 wrote to it")
	}
	if imageFile(t, s.ID()) == first {
		t.Fatal("a written disk was kept for the next tenant")
	}
	r = sh(t, s, "cat /root/answer /tmp/x /dev/shm/z 2>&1; ls /dev/shm; test -e /dev/extra && echo extra;"+
		" test -e /bin/ls && echo ls-back; ps -o comm | grep -c sleep; ipctool count; ipctool mqhas q1; echo $$")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) < 6 || strings.Contains(r.stdout, "secret") || strings.Contains(r.stdout, "\nx\n") || strings.Contains(r.stdout, "extra") {
		t.Fatalf("tenant 2 sees tenant 1: %q", r.stdout)
	}
	tail := lines[len(lines)-5:]
	if tail[0] != "ls-back" || tail[1] != "0" || tail[2] != "0" || tail[3] != "0" {
		t.Fatalf("tenant 2: /bin/ls back, no sleep, no SysV IPC, no queue: got %q", r.stdout)
	}
	if pid2, _ := strconv.Atoi(tail[4]); pid2 <= 0 || pid2 >= pid1 || pid2 > 20 {
		t.Fatalf("tenant 2's shell is pid %d (tenant 1's was %d): the PID counter was not rewound", pid2, pid1)
	}
	st2, err := s.(backend.StatsReader).Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st2.CPUTime >= st1.CPUTime || st2.DiskBytes >= st1.DiskBytes || st2.DiskBytes > 2*mib {
		t.Fatalf("usage carried over: tenant 1 %+v, tenant 2 %+v", st1, st2)
	}
	t.Logf("tenant 1: pid %d, %v CPU, %d disk bytes; tenant 2: pid %s, %v CPU, %d disk bytes", pid1, st1.CPUTime, st1.DiskBytes, tail[4], st2.CPUTime, st2.DiskBytes)
	// The file API works on the new view, and the disk limit holds there.
	if _, err := s.WriteFile(context.Background(), "/root/api", strings.NewReader("via api\n"), backend.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := sh(t, s, "cat /root/api; dd if=/dev/zero of=/root/big bs=1M count=100 2>&1 | grep -c 'No space'"); r.stdout != "via api\n1\n" {
		t.Fatalf("tenant 2 on the new disk: %q", r.stdout)
	}
	recycle(t, s)
	// A tenant that writes nothing keeps the disk.
	second := imageFile(t, s.ID())
	sh(t, s, "cat /etc/original; ls /")
	if recycle(t, s) {
		t.Fatal("scrub found a disk nobody wrote to dirty")
	}
	if imageFile(t, s.ID()) != second {
		t.Fatal("a clean disk was replaced")
	}
	// A queue made after resets that found none (init then checks with a
	// stat, not a listing) is gone too.
	if r := sh(t, s, "ipctool mqmake q2 && ipctool mqhas q2"); r.stdout != "1\n" {
		t.Fatalf("make a queue: %+v", r)
	}
	recycle(t, s)
	if r := sh(t, s, "ipctool mqhas q2"); r.stdout != "0\n" {
		t.Fatalf("the next tenant sees the last one's queue: %q", r.stdout)
	}
}

// TestRecycledTenantGetsItsOwnLoopback: a tenant's loopback traffic
// (lo's counters, the TCP stack's, a port in TIME_WAIT) is not there for
// the next tenant, after a clean and after a dirty reset: it gets a network
// namespace of its own, which a tenant that used no network leaves to the
// next. The node's DialPort reaches the new tenant's ports.
func TestRecycledTenantGetsItsOwnLoopback(t *testing.T) {
	s := newSandbox(t, newDiskBackend(t), recyclable)
	// One connection on loopback: the client's end stays in TIME_WAIT.
	const talk = "nc -l -p 5000 >/dev/null & sleep 0.3; echo hi | nc 127.0.0.1 5000; wait;"
	const look = " grep lo: /proc/net/dev | tr -s ' ' | cut -d' ' -f3,4; grep -o 'tw [0-9]*' /proc/net/sockstat"
	netns := func() string { return sh(t, s, "readlink /proc/self/ns/net").stdout }
	// A tenant that wrote a file but used no network: the next one serves
	// in init's own namespace still, which nobody used.
	own := netns()
	sh(t, s, "echo x > /root/x")
	if !recycle(t, s) {
		t.Fatal("a written disk found clean")
	}
	if now := netns(); now != own {
		t.Errorf("after a dirty reset of a tenant that used no network: namespace %s, then %s (want kept)", own, now)
	}
	for _, write := range []string{"", " echo x > /root/x;"} {
		r := sh(t, s, talk+write+look)
		if r.ExitCode != 0 || r.stdout == "0 0\ntw 0\n" {
			t.Fatalf("tenant's loopback traffic does not show (the check cannot fail): %+v", r)
		}
		used := netns()
		if dirty := recycle(t, s); dirty != (write != "") {
			t.Fatalf("reset after %q: dirty %v", write, dirty)
		}
		if r := sh(t, s, look); r.stdout != "0 0\ntw 0\n" {
			t.Fatalf("after a reset (wrote: %q) the next tenant sees the last one's loopback: %q", write, r.stdout)
		}
		if netns() == used {
			t.Fatalf("after a reset (wrote: %q) the next tenant has the last one's network namespace %s", write, used)
		}
	}
	// A tenant that never used the network leaves its namespace to the
	// next: making one costs about a third of a recycled cycle.
	quiet := netns()
	sh(t, s, "true")
	recycle(t, s)
	if now := netns(); now != quiet {
		t.Errorf("a tenant that used no network: namespace %s, then %s (want kept)", quiet, now)
	}
	served := make(chan result, 1)
	go func() { served <- sh(t, s, "echo hello | nc -l -p 5001") }()
	var conn net.Conn
	var err error
	for range 100 {
		if conn, err = s.(backend.PortDialer).DialPort(context.Background(), 5001); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("DialPort on a recycled sandbox: %v", err)
	}
	b := make([]byte, 6)
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadFull(conn, b)
	conn.Close() // nc exits when its peer closes
	if err != nil || string(b) != "hello\n" {
		t.Fatalf("DialPort read %q (%v), want hello", b, err)
	}
	<-served
}

// TestRecycleConfinement: commands of a recyclable sandbox run with a
// container's privileges inside the view: no mount, no chroot, nothing of
// init's own root (layers, templates, state) in sight.
func TestRecycleConfinement(t *testing.T) {
	s := newSandbox(t, newDiskBackend(t), recyclable)
	r := sh(t, s, "mkdir /m; mount -t tmpfs x /m 2>&1 && echo MOUNTED; chroot /tmp /bin/true 2>&1 && echo CHROOTED;"+
		" ls /proc/1/root/ 2>&1; ls /; cat /proc/self/mountinfo; grep CapEff /proc/self/status")
	for _, bad := range []string{"MOUNTED", "CHROOTED", "pool.json", " /l/", " /p ", " /q ", " /sh "} {
		if strings.Contains(r.stdout, bad) {
			t.Fatalf("escaped confinement (%q): %s", bad, r.stdout)
		}
	}
}

// TestRecycleRenewFailureLeavesNothing: a Renew that fails at any step of
// the new view leaves the sandbox to be stopped and cleaned up, and then
// nothing of it remains.
func TestRecycleRenewFailureLeavesNothing(t *testing.T) {
	b := newDiskBackend(t)
	defer func() { failStep = "" }()
	for _, st := range viewSteps {
		spec := defaultSpec(newID(t))
		recyclable(&spec)
		s := createBare(t, b, spec)
		pid := s.(*sandbox).proc.Pid
		sh(t, s, "echo dirty > /root/x")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if err := s.(backend.Recycler).Scrub(ctx); err != nil {
			t.Fatal(err)
		}
		failStep = st.Name
		if err := s.(backend.Recycler).Renew(ctx); err == nil || !strings.Contains(err.Error(), st.Name) {
			t.Fatalf("step %s: want the injected failure, got %v", st.Name, err)
		}
		failStep = ""
		if err := s.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b.Cleanup(ctx, spec.ID, s.Record()); err != nil {
			t.Fatal(err)
		}
		cancel()
		assertDiskGone(t, b, spec.ID, pid)
	}
}
