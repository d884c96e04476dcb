package container

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"golang.org/x/sys/unix"
)

func TestIsolationProcessesAndHost(t *testing.T) {
	b := newBackend(t)
	a := newSandbox(t, b, nil)
	other := newSandbox(t, b, nil)
	sh(t, other, "sleep 1000 >/dev/null 2>&1 &")
	r := sh(t, a, "ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '; echo; ps -o comm | grep -c sleep; hostname; cat /proc/self/cgroup | grep -c -v ':/$'")
	lines := strings.Split(r.stdout, "\n")
	if len(lines) < 4 {
		t.Fatalf("output %q", r.stdout)
	}
	if !strings.HasPrefix(lines[0], "1 ") || len(strings.Fields(lines[0])) > 6 {
		t.Fatalf("sandbox sees foreign pids: %q", lines[0])
	}
	if lines[1] != "0" {
		t.Fatalf("sandbox sees the other sandbox's sleep: %q", lines[1])
	}
	if lines[2] != "sbx" {
		t.Fatalf("hostname %q", lines[2])
	}
	if lines[3] != "0" {
		t.Fatalf("cgroup namespace not rooted at the sandbox: %q", r.stdout)
	}
	// From the host, init sits in <parent>/<id> in every hierarchy.
	pid := a.(*sandbox).proc.Pid
	cg, err := os.ReadFile("/proc/" + itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, ctrl := range []string{"memory", "pids", "freezer", ":"} {
		found := false
		for _, l := range strings.Split(string(cg), "\n") {
			if strings.Contains(l, ctrl) && strings.HasSuffix(l, "/"+cgParent+"/"+a.ID()) {
				found = true
			}
		}
		if !found && b.cg.Hierarchies().V1[ctrl] != "" || ctrl == ":" && !found {
			t.Fatalf("init not in sandbox cgroup %s:\n%s", ctrl, cg)
		}
	}
}

func TestUpperLayerPrivate(t *testing.T) {
	b := newBackend(t)
	a := newSandbox(t, b, nil)
	other := newSandbox(t, b, nil)
	sh(t, a, "echo changed > /etc/original; echo new > /etc/added")
	if r := sh(t, other, "cat /etc/original; ls /etc/added 2>&1 | grep -c 'No such'"); r.stdout != "original\n1\n" {
		t.Fatalf("second sandbox sees first's writes: %q", r.stdout)
	}
	if b, _ := os.ReadFile(filepath.Join(layerDir, "etc/original")); string(b) != "original\n" {
		t.Fatalf("layer modified: %q", b)
	}
	up, _ := os.ReadFile(filepath.Join(tmpRoot, "upper", a.ID(), "upper/etc/added"))
	if string(up) != "new\n" {
		t.Fatalf("write not in upper dir: %q", up)
	}
}

func TestMemoryLimitOOM(t *testing.T) {
	b := newBackend(t)
	s := newSandbox(t, b, func(sp *backend.Spec) { sp.Resources.MemoryBytes = 32 << 20 })
	r := run1(t, s, backend.ExecSpec{Argv: []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=128M", "count=1"}})
	if !r.OOMKilled || r.Signal != int(unix.SIGKILL) {
		t.Fatalf("want OOM kill: %+v", r)
	}
	if r := sh(t, s, "echo alive"); r.stdout != "alive\n" {
		t.Fatalf("sandbox dead after OOM: %+v", r)
	}
}

func TestPidsLimitForkBomb(t *testing.T) {
	b := newBackend(t)
	s := newSandbox(t, b, func(sp *backend.Spec) { sp.Resources.Pids = 32 })
	r, err := tryRun(context.Background(), s, backend.ExecSpec{
		Argv:    []string{"sh", "-c", "b() { b | b & }; b; sleep 1000"},
		Timeout: 2 * time.Second,
	})
	// The bomb either runs into the timeout or its main shell fails to fork.
	if err != nil || !r.TimedOut && r.ExitCode == 0 {
		t.Fatalf("fork bomb: %+v %v", r, err)
	}
	if hits, err := b.cg.Group(s.ID()).PidsLimitHits(); err != nil || hits == 0 {
		t.Fatalf("pids limit never hit: %d %v", hits, err)
	}
	// The bomb's orphans may outlive the group kill; kill them from inside
	// and check the sandbox still answers.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		r, err := tryRun(ctx, s, backend.ExecSpec{Argv: []string{"sh", "-c", "kill -9 -1; echo ok"}})
		if err == nil && strings.Contains(r.stdout, "ok") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("sandbox does not answer after fork bomb: %v", err)
		}
	}
}

func readCounter(t *testing.T, s backend.Sandbox) string {
	rc, err := s.ReadFile(context.Background(), "/tmp/c", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	return string(bytes.TrimSpace(b))
}

func TestPauseResume(t *testing.T) {
	s := newSandbox(t, newBackend(t), nil)
	sh(t, s, "i=0; echo 0 > /tmp/c; (while true; do i=$((i+1)); echo $i > /tmp/c.n; mv /tmp/c.n /tmp/c; done) >/dev/null 2>&1 &")
	ctx := context.Background()
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatalf("second pause: %v", err)
	}
	v1 := readCounter(t, s)
	time.Sleep(200 * time.Millisecond) // a frozen counter cannot move, however long we wait
	if v2 := readCounter(t, s); v1 != v2 {
		t.Fatalf("counter advanced while paused: %s -> %s", v1, v2)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for readCounter(t, s) == v1 {
		if time.Now().After(deadline) {
			t.Fatal("counter does not advance after resume")
		}
		time.Sleep(time.Millisecond)
	}
	if r := sh(t, s, "echo ok"); r.stdout != "ok\n" {
		t.Fatal("exec after resume")
	}
}

func TestFiles(t *testing.T) {
	s := newSandbox(t, newBackend(t), nil)
	ctx := context.Background()
	if _, err := s.WriteFile(ctx, "/tmp/x/y.txt", strings.NewReader("data"), backend.WriteOptions{Mode: 0o644, MakeParents: true}); err != nil {
		t.Fatal(err)
	}
	if r := sh(t, s, "cat /tmp/x/y.txt"); r.stdout != "data" {
		t.Fatalf("exec sees %q", r.stdout)
	}
	sh(t, s, "ln -s / /tmp/escape; echo in > /tmp/in")
	fi, err := s.Stat(ctx, "/tmp/escape/tmp/in")
	if err != nil || fi.Size != 3 {
		t.Fatalf("stat through symlink: %+v %v", fi, err)
	}
}

func itoa(i int) string { return strconvItoa(i) }
