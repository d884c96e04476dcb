package container

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
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
	// init (the stub), its server and the five of the pipeline.
	if !strings.HasPrefix(lines[0], "1 ") || len(strings.Fields(lines[0])) > 7 {
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

func itoa(i int) string { return strconvItoa(i) }
