package container

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/guest/init"
)

func statusFields(t *testing.T, pid int) []map[string]string {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("no tasks for %d: %v", pid, err)
	}
	var out []map[string]string
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok {
				m[k] = strings.TrimSpace(v)
			}
		}
		out = append(out, m)
	}
	return out
}

func wantCaps() string {
	var m uint64
	for _, c := range initproc.DefaultCaps {
		m |= 1 << c
	}
	return fmt.Sprintf("%016x", m)
}

func checkHardened(t *testing.T, what string, pid int, effective bool) {
	t.Helper()
	for _, st := range statusFields(t, pid) {
		if st["Seccomp"] != "2" || st["NoNewPrivs"] != "1" || st["CapBnd"] != wantCaps() ||
			effective && st["CapEff"] != wantCaps() {
			t.Fatalf("%s %d thread %s: Seccomp=%s NoNewPrivs=%s CapBnd=%s CapEff=%s (want caps %s)",
				what, pid, st["Pid"], st["Seccomp"], st["NoNewPrivs"], st["CapBnd"], st["CapEff"], wantCaps())
		}
	}
}

func TestHardeningHostView(t *testing.T) {
	b := newBackend(t)
	s := newSandbox(t, b, nil)
	initPid := s.(*sandbox).proc.Pid
	checkHardened(t, "init", initPid, true)
	if st := statusFields(t, initPid)[0]; len(st["Threads"]) == 0 {
		t.Fatal("no Threads field")
	}
	// A process started by exec, found on the host through the cgroup.
	sh(t, s, "sleep 1000 >/dev/null 2>&1 &")
	var child int
	deadline := time.Now().Add(10 * time.Second)
	for child == 0 && time.Now().Before(deadline) {
		procs, err := b.cg.Group(s.ID()).Procs()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range procs {
			if c, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/comm"); strings.TrimSpace(string(c)) == "sleep" {
				child = p
			}
		}
		time.Sleep(time.Millisecond)
	}
	if child == 0 {
		t.Fatal("exec'd sleep not found in the sandbox cgroup")
	}
	checkHardened(t, "exec child", child, true)
	if d, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", initPid)); !strings.Contains(string(d), "NSpid:\t"+strconv.Itoa(initPid)+"\t1") {
		t.Fatalf("init is not PID 1 of its namespace:\n%s", d)
	}
}

func TestContainmentInside(t *testing.T) {
	s := newSandbox(t, newBackend(t), nil)
	checks := map[string]string{
		"masked kcore":         "cat /proc/kcore 2>/dev/null | wc -c",
		"masked kpageflags":    "wc -c < /proc/kpageflags",
		"masked acpi":          "ls /proc/acpi | wc -l",
		"ro /proc/sys":         "echo 1 > /proc/sys/kernel/ctrl-alt-del 2>/dev/null && echo writable || echo 0",
		"ro /sys":              "touch /sys/x 2>/dev/null && echo writable || echo 0",
		"no mount":             "mount -t tmpfs t /mnt 2>/dev/null && echo mounted || echo 0",
		"no mknod":             "mknod /tmp/n c 1 3 2>/dev/null && echo made || echo 0",
		"no host net":          "ls /sys/class/net | grep -v -c '^lo$'",
		"kill 1 is harmless":   "kill -TERM 1; kill -INT 1; kill -HUP 1; echo 0",
		"no core dumps":        "ulimit -c",
		"init fds unreachable": "readlink /proc/1/fd/2 /proc/1/fd/3 /proc/1/exe /proc/1/root 2>/dev/null | wc -l; echo x 2>/dev/null >> /proc/1/fd/2 && echo wrote",
	}
	for name, script := range checks {
		r := run1(t, s, backend.ExecSpec{Argv: []string{"sh", "-c", script}, Timeout: 10 * time.Second})
		if strings.TrimSpace(r.stdout) != "0" {
			t.Errorf("%s: %q -> %q %q", name, script, r.stdout, r.stderr)
		}
	}
	if r := sh(t, s, "echo still here"); r.stdout != "still here\n" {
		t.Fatal("sandbox died after signals to PID 1")
	}
	if r := sh(t, s, "ip link 2>/dev/null | grep -c 'lo:.*UP' || cat /sys/class/net/lo/operstate"); strings.TrimSpace(r.stdout) == "0" {
		t.Fatalf("lo not up: %q", r.stdout)
	}
}
