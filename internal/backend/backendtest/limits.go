package backendtest

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// The limits of the sandbox the limit subtests share, each set when the
// backend enforces it.
const (
	cpuLimitMillis = 250
	pidsLimitCount = 32
	diskLimitBytes = 16 << 20
)

// limitedSandbox is the limit subtests' sandbox: one for all of them (an
// emulated guest's boot costs minutes).
type limitedSandbox struct {
	s      backend.Sandbox
	id     string
	record []byte
}

// limited returns the limit subtests' sandbox, made on first use with
// every limit the backend enforces, or skips the subtest when the backend
// says it does not enforce l (a NotSupported error from
// backend.LimitEnforcer; any other answer fails the run).
func (st *suite) limited(t *testing.T, l backend.Limit) backend.Sandbox {
	t.Helper()
	le, ok := st.b.(backend.LimitEnforcer)
	if !ok {
		t.Skipf("%s backend: does not say which limits it enforces (no backend.LimitEnforcer), so %s is untested", st.b.Name(), l)
	}
	if err := le.Enforces(l); errdefs.IsNotSupported(err) {
		t.Skipf("%s backend: %v", st.b.Name(), err)
	} else if err != nil {
		t.Fatalf("Enforces(%s): %v; want nil or not supported", l, err)
	}
	if st.lim != nil {
		return st.lim.s
	}
	spec := st.h.Spec(t)
	r := &spec.Resources
	for lim, set := range map[backend.Limit]func(){
		backend.LimitCPU:  func() { r.CPUMillis = cpuLimitMillis },
		backend.LimitPids: func() { r.Pids = pidsLimitCount },
		backend.LimitDisk: func() { r.DiskBytes = diskLimitBytes },
	} {
		if le.Enforces(lim) == nil {
			set()
		}
	}
	s, err := st.b.Create(st.ctx(t), spec)
	if err != nil {
		t.Fatalf("create %s with limits %+v: %v", spec.ID, spec.Resources, err)
	}
	st.lim = &limitedSandbox{s: s, id: spec.ID, record: s.Record()}
	return s
}

// dropLimited removes the limit subtests' sandbox once they ran.
func (st *suite) dropLimited(t *testing.T) {
	if st.lim != nil {
		st.cleanup(t, st.lim.id, st.lim.record)
		st.lim = nil
	}
}

// shOn runs a script on s with the image's shell.
func (st *suite) shOn(t *testing.T, s backend.Sandbox, script string) result {
	t.Helper()
	r, err := Exec(st.ctx(t), s, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", script}})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return result{r.ExecResult, r.Stdout, r.Stderr}
}

func (st *suite) cpuTime(t *testing.T, s backend.Sandbox, sr backend.StatsReader) time.Duration {
	t.Helper()
	stats, err := sr.Stats(st.ctx(t))
	if err != nil {
		t.Fatalf("stats of %s: %v", s.ID(), err)
	}
	return stats.CPUTime
}

// cpuLimit: two busy loops in a sandbox of a quarter core use, by the
// sandbox's own CPU counter, at most about a quarter of the time that
// passes (half as much again for accounting slack), where unlimited they
// would take up to two cores.
func (st *suite) cpuLimit(t *testing.T) {
	const millis = cpuLimitMillis
	s := st.limited(t, backend.LimitCPU)
	sr, ok := s.(backend.StatsReader)
	if !ok {
		t.Fatalf("the backend enforces %s, but its sandbox (%T) has no usage counters (backend.StatsReader)", backend.LimitCPU, s)
	}
	pids := st.shOn(t, s, "for i in 1 2; do (while :; do :; done) >/dev/null 2>&1 & echo $!; done").stdout
	defer st.shOn(t, s, "kill -9 "+strings.Join(strings.Fields(pids), " "))
	time.Sleep(500 * time.Millisecond) // the loops are running
	cpu0, wall0 := st.cpuTime(t, s, sr), time.Now()
	time.Sleep(3 * time.Second)
	used, window := st.cpuTime(t, s, sr)-cpu0, time.Since(wall0)
	allowed := window * millis / 1000 * 3 / 2
	t.Logf("busy loops used %v of CPU in %v (limit %dm: at most %v)", used, window, millis, allowed)
	if used > allowed {
		t.Errorf("busy loops used %v of CPU in %v; the %dm limit allows about %v", used, window, millis, window*millis/1000)
	}
	if used <= 0 {
		t.Errorf("busy loops used no CPU in %v by the sandbox's counter", window)
	}
}

// pidsLimit: a loop forking sleepers stops at the pids limit (the fork
// fails; the shell, and the other processes, run on), the sandbox serves
// again once they are gone, and other sandboxes were never short.
func (st *suite) pidsLimit(t *testing.T) {
	const limit = pidsLimitCount
	s := st.limited(t, backend.LimitPids)
	// Builtins only once the sleepers hold the limit: read, echo and kill
	// need no fork. The subshell dies when a fork fails (ash's rule).
	r := st.shOn(t, s, "(i=0; while [ $i -lt 200 ]; do sleep 1000 & echo $! >> /tmp/sleepers; i=$((i+1)); echo $i > /tmp/forks; done) 2>/dev/null;"+
		" read n < /tmp/forks; echo $n; while read p; do kill -9 $p; done < /tmp/sleepers")
	n, err := strconv.Atoi(strings.TrimSpace(r.stdout))
	if err != nil {
		t.Fatalf("fork loop: %q, stderr %q: %v", r.stdout, r.stderr, err)
	}
	t.Logf("forked %d sleepers under a limit of %d pids", n, limit)
	if n >= 200 || n > limit {
		t.Errorf("forked %d sleepers under a pids limit of %d", n, limit)
	}
	st.waitServes(t, s)
	if got := st.sh(t, "echo unharmed"); got != "unharmed\n" {
		t.Errorf("another sandbox after the fork loop: %q", got)
	}
}

// waitServes waits until s runs a command again (killed processes may
// take a moment to release their pids).
func (st *suite) waitServes(t *testing.T, s backend.Sandbox) {
	t.Helper()
	ctx := st.ctx(t)
	for {
		r, err := Exec(ctx, s, backend.ExecSpec{Argv: []string{"/bin/sh", "-c", "echo ok"}})
		if err == nil && r.Stdout == "ok\n" {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("sandbox %s does not serve after the limit was hit: %v, %+v", s.ID(), err, r)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// diskLimit: writing past the writable layer's limit fails with ENOSPC or
// EDQUOT, and the space comes back once the file is gone.
func (st *suite) diskLimit(t *testing.T) {
	const limit = diskLimitBytes
	s := st.limited(t, backend.LimitDisk)
	r := st.shOn(t, s, "dd if=/dev/zero of=/root/fill bs=1M count=64 2>&1; echo rc=$?; wc -c < /root/fill")
	if !strings.Contains(r.stdout, "No space left on device") && !strings.Contains(r.stdout, "quota exceeded") {
		t.Errorf("writing 64 MiB past a %d MiB limit: %q; want ENOSPC or EDQUOT", limit>>20, r.stdout)
	}
	if strings.Contains(r.stdout, "rc=0\n") {
		t.Errorf("dd past the disk limit exited 0: %q", r.stdout)
	}
	if lines := strings.Fields(r.stdout); len(lines) > 0 {
		if n, err := strconv.ParseInt(lines[len(lines)-1], 10, 64); err != nil || n > limit {
			t.Errorf("wrote %s bytes under a limit of %d", lines[len(lines)-1], limit)
		}
	}
	if r := st.shOn(t, s, "rm /root/fill && dd if=/dev/zero of=/root/again bs=1M count=4 2>/dev/null && rm /root/again && echo ok"); r.stdout != "ok\n" {
		t.Errorf("after removing the filler: %q, stderr %q; want a 4 MiB write to succeed", r.stdout, r.stderr)
	}
}
