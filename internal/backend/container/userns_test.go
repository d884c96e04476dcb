package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
)

// TestUserNamespace: each sandbox's ids 0..65535 map to a host range of its
// own; files keep the image's ids on the writable layer (seen by the
// sandbox as its own root's and users'), and the file API writes as the
// sandbox's root.
func TestUserNamespace(t *testing.T) {
	b := newBackend(t)
	s1, s2 := newSandbox(t, b, nil), newSandbox(t, b, nil)
	r1, r2 := s1.(*sandbox).ids, s2.(*sandbox).ids
	if r1.Host < 1<<20 || r1.Host == r2.Host || r1.Size != 65536 {
		t.Fatalf("id ranges %+v and %+v: want distinct ranges above 2^20", r1, r2)
	}
	m, _ := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", s1.(*sandbox).proc.Pid))
	if got := strings.Fields(string(m)); len(got) != 3 || got[0] != "0" || got[1] != fmt.Sprint(r1.Host) || got[2] != "65536" {
		t.Fatalf("uid_map of init: %q, want 0 %d 65536", m, r1.Host)
	}
	r := run1(t, s1, backend.ExecSpec{Argv: []string{"sh", "-c", "id -u; stat -c %u:%g /etc/passwd /home/agent; echo r > /tmp/root-file"}})
	if r.stdout != "0\n0:0\n1000:1000\n" {
		t.Fatalf("inside: %q (stderr %q), want root, image files owned by 0 and 1000", r.stdout, r.stderr)
	}
	r = run1(t, s1, backend.ExecSpec{Argv: []string{"sh", "-c", "id -u; echo a > /home/agent/agent-file"}, User: "1000"})
	if r.stdout != "1000\n" || r.ExitCode != 0 {
		t.Fatalf("as 1000: %+v", r)
	}
	root := fmt.Sprintf("/proc/%d/root", s1.(*sandbox).proc.Pid)
	for path, want := range map[string]uint32{"/tmp/root-file": r1.Host, "/home/agent/agent-file": r1.Host + 1000} {
		var st syscall.Stat_t
		if err := syscall.Stat(root+path, &st); err != nil || st.Uid != want || st.Gid != want {
			t.Errorf("%s on the host: owner %d:%d (%v), want %d", path, st.Uid, st.Gid, err, want)
		}
	}
	// On the writable layer the ids stay the image's (pack needs no shift).
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(tmpRoot, "upper", s1.ID(), "upper/tmp/root-file"), &st); err != nil || st.Uid != 0 {
		t.Errorf("root-file on the upper dir: uid %d (%v), want 0", st.Uid, err)
	}
	ctx := context.Background()
	if _, err := s1.WriteFile(ctx, "/home/agent/api/f", strings.NewReader("x"), backend.WriteOptions{Mode: 0o644, MakeParents: true}); err != nil {
		t.Fatal(err)
	}
	if r := sh(t, s1, "stat -c %u:%g /home/agent/api /home/agent/api/f"); r.stdout != "0:0\n0:0\n" {
		t.Fatalf("file API files inside: %q, want the sandbox's root", r.stdout)
	}
	if fi, err := s1.Stat(ctx, "/home/agent"); err != nil || fi.UID != 1000 || fi.GID != 1000 {
		t.Fatalf("Stat /home/agent: %+v %v, want owner 1000 as inside", fi, err)
	}
	if list, err := s1.ListDir(ctx, "/home/agent/api"); err != nil || len(list) != 1 || list[0].UID != 0 {
		t.Fatalf("ListDir: %+v %v, want f owned by 0", list, err)
	}
	if r := sh(t, s1, "echo y >> /home/agent/api/f && cat /home/agent/api/f"); r.stdout != "xy\n" {
		t.Fatalf("root cannot append to the file API's file: %+v", r)
	}
	// The other sandbox sees none of it, and the devices still work.
	if r := sh(t, s2, "ls /tmp/root-file 2>&1; echo hi > /dev/null && head -c 4 /dev/zero | wc -c"); !strings.Contains(r.stdout, "No such file") || !strings.HasSuffix(r.stdout, "4\n") {
		t.Fatalf("other sandbox: %q", r.stdout)
	}
}

// TestBestEffort: a best-effort sandbox sits under the idle cgroup parent,
// and its processes run under SCHED_IDLE with RLIMIT_NICE 0.
func TestBestEffort(t *testing.T) {
	b := newBackend(t)
	s := newSandbox(t, b, func(sp *backend.Spec) { sp.Resources.BestEffort = true })
	normal := newSandbox(t, b, nil)
	policy := "cut -d' ' -f41 /proc/self/stat; grep 'Max nice' /proc/self/limits | tr -s ' ' | sed 's/ *$//'"
	if r := sh(t, s, policy); r.stdout != "5\nMax nice priority 0 0\n" {
		t.Fatalf("best-effort: %q, want SCHED_IDLE (5) and RLIMIT_NICE 0", r.stdout)
	}
	if r := sh(t, normal, policy); !strings.HasPrefix(r.stdout, "0\n") {
		t.Fatalf("default class: %q, want SCHED_OTHER (0)", r.stdout)
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", s.(*sandbox).proc.Pid))
	if want := "/" + cgParent + cgroup.IdleSuffix + "/" + s.ID(); !strings.Contains(string(cg), want) {
		t.Fatalf("cgroups of a best-effort init: %s, want under %s", cg, want)
	}
	if mgr, err := cgroup.NewManager(cgParent); err == nil && mgr.Hierarchies().V1["cpu"] != "" {
		idle, _ := os.ReadFile(filepath.Join(mgr.Hierarchies().V1["cpu"], cgParent+cgroup.IdleSuffix, "cpu.idle"))
		if strings.TrimSpace(string(idle)) != "1" {
			t.Fatalf("cpu.idle of the best-effort parent: %q", idle)
		}
	}
}

// TestIDRangeReleased: a sandbox's id range goes back on cleanup, and a
// range left without a sandbox (a crash between steps) goes at the sweep.
func TestIDRangeReleased(t *testing.T) {
	b := newBackend(t)
	ctx := context.Background()
	spec := defaultSpec(newID(t))
	s, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	holds := func(id string) bool {
		owners, err := b.cfg.IDRanges.Owners()
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(owners, id)
	}
	if !holds(spec.ID) {
		t.Fatal("running sandbox holds no id range")
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Cleanup(ctx, spec.ID, s.Record()); err != nil {
		t.Fatal(err)
	}
	if holds(spec.ID) {
		t.Fatal("id range still held after cleanup")
	}
	leaked := newID(t)
	if _, err := b.cfg.IDRanges.Allocate(leaked); err != nil {
		t.Fatal(err)
	}
	if err := b.Sweep(ctx, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if holds(leaked) {
		t.Fatal("sweep left a leaked id range")
	}
}

// TestPoolViewReplacesLowerDir: in a pooled sandbox (its view mounted
// inside the user namespace), a directory of the image can be removed and
// made anew, holding only the new files; renaming one works too.
func TestPoolViewReplacesLowerDir(t *testing.T) {
	s := newSandbox(t, newBackend(t), func(sp *backend.Spec) { sp.Resettable = true })
	r := sh(t, s, "rm -rf /home && mkdir /home && echo x > /home/new && ls -A /home && mv /etc /etc2 && ls /etc2/passwd")
	if r.stdout != "new\n/etc2/passwd\n" || r.ExitCode != 0 {
		t.Fatalf("replace a lower directory in the view: %q %q", r.stdout, r.stderr)
	}
}
