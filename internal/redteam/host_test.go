package redteam

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/procfs"
	"github.com/corral-dev/corral/internal/testenv"
)

// sandboxCaps is the reviewed capability set of a container sandbox
// (CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID,
// NET_BIND_SERVICE, SETFCAP): the bounding set must be exactly this, the
// effective set of any process a subset.
const sandboxCaps = 1<<0 | 1<<1 | 1<<3 | 1<<4 | 1<<5 | 1<<6 | 1<<7 | 1<<10 | 1<<31

// proc is one host process of a sandbox and its cgroup paths by controller
// ("" for the v2 tree).
type proc struct {
	pid     int
	cgroups map[string]string
}

// sandboxPids lists the host processes in the sandbox's cgroup, in any
// hierarchy.
func sandboxPids(cgroupParent, id string) []proc {
	needle := "/" + cgroupParent + "/" + id
	var out []proc
	for pid := range procfs.PIDs() {
		data, err := os.ReadFile(procfs.Path(pid, "cgroup"))
		if err != nil {
			continue
		}
		p := proc{pid: pid, cgroups: map[string]string{}}
		in := false
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			f := strings.SplitN(line, ":", 3)
			if len(f) != 3 {
				continue
			}
			if f[2] == needle || strings.HasPrefix(f[2], needle+"/") {
				in = true
			}
			for _, ctrl := range strings.Split(f[1], ",") {
				p.cgroups[ctrl] = f[2]
			}
		}
		if in {
			out = append(out, p)
		}
	}
	return out
}

// statusField returns a field of /proc/<pid>/task/<tid>/status.
func statusField(status, key string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestHostSide checks each sandbox from the host: seccomp mode 2, no_new_privs
// and the capability sets on every thread, the cgroup limits as written in the
// cgroup files, no fd of the node in a sandbox process, the uid mapping and
// no RLIMIT_FSIZE.
func TestHostSide(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		skipIfTableSays(t, backend, "host/")
		// An fd the node inherited without O_CLOEXEC, as from a harness that
		// starts it: it must not reach the sandbox.
		leak, err := syscall.Open(filepath.Join(t.TempDir(), "inherited"), syscall.O_RDWR|syscall.O_CREAT, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Close(leak) })
		srv, _ := startServer(t)
		res := client.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, Pids: 100}
		sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend, Resources: res})
		testenv.Sh(t, sb, "sleep 1000 >/dev/null 2>&1 &")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { // a running exec, so its stdio pipes are there to look at
			defer close(done)
			_, _ = sb.Exec(ctx, client.Command{Args: []string{"sleep", "60"}})
		}()
		t.Cleanup(func() { cancel(); <-done })
		var procs []proc
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && len(procs) < 3; time.Sleep(50 * time.Millisecond) {
			procs = sandboxPids(srv.Config.CgroupParent, sb.ID())
		}
		if len(procs) < 3 {
			t.Fatalf("found %d sandbox processes, want init, the background sleep and the exec", len(procs))
		}
		judge(t, backend, threadChecks(procs))
		judge(t, backend, cgroupChecks(procs[0], res))
		judge(t, backend, []Result{nodeFdCheck(procs)})
		judge(t, backend, isolationChecks(procs))
		other := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend})
		otherProcs := sandboxPids(srv.Config.CgroupParent, other.ID())
		if len(otherProcs) == 0 {
			t.Fatal("second sandbox: no processes found")
		}
		judge(t, backend, []Result{usernsCheck(t, sb, procs[0].pid, otherProcs[0].pid)})
	})
}

// usernsCheck: each sandbox's user namespace maps its ids 0..65535 to a host
// range of its own, away from host root; a file its root makes is owned on
// the host by the range's first id, and a file written through the file API
// belongs to the sandbox's root.
func usernsCheck(t *testing.T, sb *client.Sandbox, pid, otherPid int) Result {
	hostRoot := func(pid int) (int64, string) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
		f := strings.Fields(string(b))
		if len(f) != 3 || f[0] != "0" || f[2] != "65536" {
			return -1, strings.TrimSpace(string(b))
		}
		host, _ := strconv.ParseInt(f[1], 10, 64)
		return host, strings.TrimSpace(string(b))
	}
	base, m := hostRoot(pid)
	otherBase, otherMap := hostRoot(otherPid)
	testenv.Sh(t, sb, "echo x > /tmp/made-by-root")
	var st syscall.Stat_t
	statErr := syscall.Stat(fmt.Sprintf("/proc/%d/root/tmp/made-by-root", pid), &st)
	if err := sb.Files().Write(context.Background(), "/tmp/made-by-api", []byte("x")); err != nil {
		t.Fatal(err)
	}
	apiOwner := strings.TrimSpace(testenv.Sh(t, sb, "stat -c %u:%g /tmp/made-by-api"))
	ok := base > 0 && otherBase > 0 && base != otherBase &&
		(base+65536 <= otherBase || otherBase+65536 <= base) &&
		statErr == nil && int64(st.Uid) == base && int64(st.Gid) == base && apiOwner == "0:0"
	// An attempt, not a check: "succeeded" would mean the sandbox's root
	// is host root, or shares its ids with another sandbox.
	r := check("host/userns-uid-range", ok,
		"uid_map %q, other sandbox's %q; file made by root inside: host owner %d:%d (%v); file API file inside: %s",
		m, otherMap, st.Uid, st.Gid, statErr, apiOwner)
	r.Outcome = map[bool]string{true: "blocked", false: "succeeded"}[ok]
	return r
}

func threadChecks(procs []proc) []Result {
	var seccompBad, nnpBad, capBad []string
	threads := 0
	for _, p := range procs {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", p.pid))
		for _, task := range tasks {
			data, err := os.ReadFile(task)
			if err != nil {
				continue // exited meanwhile
			}
			threads++
			st := string(data)
			if v := statusField(st, "Seccomp"); v != "2" {
				seccompBad = append(seccompBad, task+" Seccomp:"+v)
			}
			if v := statusField(st, "NoNewPrivs"); v != "1" {
				nnpBad = append(nnpBad, task+" NoNewPrivs:"+v)
			}
			bnd, _ := strconv.ParseUint(statusField(st, "CapBnd"), 16, 64)
			eff, _ := strconv.ParseUint(statusField(st, "CapEff"), 16, 64)
			prm, _ := strconv.ParseUint(statusField(st, "CapPrm"), 16, 64)
			if bnd != sandboxCaps || eff&^sandboxCaps != 0 || prm&^sandboxCaps != 0 {
				capBad = append(capBad, fmt.Sprintf("%s CapBnd %#x CapEff %#x CapPrm %#x", task, bnd, eff, prm))
			}
		}
	}
	return []Result{
		check("host/seccomp-mode-2", len(seccompBad) == 0 && threads > 0, "%d threads; bad: %v", threads, seccompBad),
		check("host/no-new-privs", len(nnpBad) == 0 && threads > 0, "%d threads; bad: %v", threads, nnpBad),
		check("host/capabilities", len(capBad) == 0 && threads > 0, "%d threads, want CapBnd %#x; bad: %v", threads, uint64(sandboxCaps), capBad),
	}
}

// cgroupChecks read the limits back from the cgroup files of the
// sandbox (v1 controllers or the v2 tree).
func cgroupChecks(p proc, res client.Resources) []Result {
	read := func(ctrl, file string) string {
		dir := "/sys/fs/cgroup/" + ctrl + p.cgroups[ctrl]
		if _, ok := p.cgroups[ctrl]; !ok {
			dir = "/sys/fs/cgroup" + p.cgroups[""]
		}
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return "error: " + err.Error()
		}
		return strings.TrimSpace(string(b))
	}
	var mem, pids, cpu string
	var memOK, pidsOK, cpuOK bool
	if _, v1 := p.cgroups["memory"]; v1 {
		mem = read("memory", "memory.limit_in_bytes")
	} else {
		mem = read("", "memory.max")
	}
	memOK = mem == strconv.FormatInt(res.MemoryBytes, 10)
	if _, v1 := p.cgroups["pids"]; v1 {
		pids = read("pids", "pids.max")
	} else {
		pids = read("", "pids.max")
	}
	pidsOK = pids == strconv.FormatInt(res.Pids, 10)
	var quota, period int64
	if _, v1 := p.cgroups["cpu"]; v1 {
		cpu = read("cpu", "cpu.cfs_quota_us") + " " + read("cpu", "cpu.cfs_period_us")
	} else {
		cpu = read("", "cpu.max")
	}
	if _, err := fmt.Sscan(cpu, &quota, &period); err == nil && period > 0 {
		cpuOK = quota*1000/period == res.CPUMillis
	}
	return []Result{
		check("host/cgroup-memory", memOK, "memory limit %s, want %d", mem, res.MemoryBytes),
		check("host/cgroup-pids", pidsOK, "pids.max %s, want %d", pids, res.Pids),
		check("host/cgroup-cpu", cpuOK, "cpu quota/period %s, want %d millicores", cpu, res.CPUMillis),
	}
}

type fileID struct{ dev, ino uint64 }

// nodeFdCheck: no sandbox process holds an open file of the node (this
// test process), apart from stdio: init's log and the pipes of an exec,
// whose other end the node reads.
func nodeFdCheck(procs []proc) Result {
	node := map[fileID]string{}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		var st syscall.Stat_t
		p := "/proc/self/fd/" + fd.Name()
		target, _ := os.Readlink(p)
		if syscall.Stat(p, &st) == nil && !strings.HasPrefix(target, "anon_inode:") {
			node[fileID{st.Dev, st.Ino}] = target
		}
	}
	var bad, seen []string
	for _, pr := range procs {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pr.pid))
		for _, fd := range fds {
			p := fmt.Sprintf("/proc/%d/fd/%s", pr.pid, fd.Name())
			target, _ := os.Readlink(p)
			seen = append(seen, fmt.Sprintf("%d:%s=%s", pr.pid, fd.Name(), target))
			var st syscall.Stat_t
			if syscall.Stat(p, &st) != nil {
				continue
			}
			if st.Mode&syscall.S_IFMT == syscall.S_IFCHR {
				// /dev/null & co. are bound from the host's /dev: the
				// same kernel objects for everyone, no channel to the node.
				continue
			}
			nodeTarget, shared := node[fileID{st.Dev, st.Ino}]
			// Stdio is meant to be shared: init's log and the exec pipes.
			stdio := fd.Name() == "0" || fd.Name() == "1" || fd.Name() == "2"
			if shared && !stdio {
				bad = append(bad, fmt.Sprintf("pid %d fd %s = %s (node's %s)", pr.pid, fd.Name(), target, nodeTarget))
			}
		}
	}
	return check("host/node-fds", len(bad) == 0, "shared with the node: %v; all fds: %s", bad, strings.Join(seen, " "))
}

// isolationChecks: no RLIMIT_FSIZE on the processes init starts. The
// disk quota bounds writes (ENOSPC, what programs expect); a file size
// limit would only break software that expects none, as under Docker.
func isolationChecks(procs []proc) []Result {
	var fsize []string
	for _, p := range procs[1:] {
		limits, _ := os.ReadFile(fmt.Sprintf("/proc/%d/limits", p.pid))
		for _, line := range strings.Split(string(limits), "\n") {
			if strings.HasPrefix(line, "Max file size") {
				fsize = append(fsize, strings.Join(strings.Fields(line)[3:5], "/"))
			}
		}
	}
	unlimited := len(fsize) > 0
	for _, f := range fsize {
		if f != "unlimited/unlimited" {
			unlimited = false
		}
	}
	return []Result{
		check("host/rlimit-fsize", unlimited, "Max file size (soft/hard) of sandbox processes: %v", fsize),
	}
}
