package redteam

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// latencies are one window's samples: sandbox B's `true` exec, and the
// host's own fork+exec+wait of /bin/true (the peer), taken in turn so that
// both see the same moments of an attack.
type latencies struct {
	b, host []time.Duration
	failed  int // B's failed execs
}

// latency measures sandbox b's `true` exec, alternating with the host's
// fork+exec of /bin/true, for up to d or n samples of each.
func latency(b *client.Sandbox, d time.Duration, n int) latencies {
	var l latencies
	deadline := time.Now().Add(d)
	for len(l.b) < n && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		res, err := b.Run(ctx, client.Command{Args: []string{"true"}})
		cancel()
		if err != nil || res.ExitCode != 0 {
			l.failed++
		} else {
			l.b = append(l.b, time.Since(start))
		}
		if took, err := hostTrue(); err == nil {
			l.host = append(l.host, took)
		}
	}
	return l
}

// hostTrue is one fork+exec+wait of the host's /bin/true from this
// process: what the machine does without corral, the peer of B's exec.
func hostTrue() (time.Duration, error) {
	start := time.Now()
	err := exec.Command("/bin/true").Run()
	return time.Since(start), err
}

// us rounds d to the microsecond, for the report.
func us(d time.Duration) time.Duration { return d.Round(time.Microsecond) }

// p50 returns the median of samples.
func p50(samples []time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return s[len(s)/2]
}

// clearOut kills what an attack left running in sb (spinners, the rest of a
// fork bomb), which would load the next window. The exec itself may fail
// while a bomb still holds the pids limit: it is tried again.
func clearOut(t *testing.T, sb *client.Sandbox) {
	var err error
	for range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var res *client.Result
		res, err = sb.Run(ctx, client.Command{Shell: "kill -9 -1; true"})
		cancel()
		if err == nil && res.ExitCode == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("could not clear out %s before the next load: %v", sb.ID(), err)
}

// load is one noisy-neighbour attack run in sandbox A.
type load struct {
	name  string
	cmd   client.Command
	check func(res *client.Result, a, b *client.Sandbox) []Result
	// bestEffort: the attack runs in a best-effort sandbox instead of A.
	bestEffort bool
}

// TestNoisyNeighbours runs, in sandbox A, a fork bomb, a memory bomb, a disk
// fill, a `yes` flood to stdout and a CPU spin on every core while sandbox B
// answers `true` execs. It prints B's exec latency under each against B's
// idle latency measured just before that attack, and beside it the host's
// own fork/exec in the same windows (a measurement: the 2× target of issue
// 8 is in the table, not asserted)
// and asserts that A's limits held, B kept answering and the daemon
// stayed responsive. The CPU spin runs twice: in A, of the default class,
// and in a best-effort sandbox, whose processes must not be able to leave
// SCHED_IDLE.
func TestNoisyNeighbours(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		skipIfTableSays(t, backend, "resource/")
		// The daemon in a node cgroup of its own, as `corral serve` runs
		// by default: B's exec is the daemon's work as much as B's.
		srv, _ := startServer(t, func(c *server.Config) { c.NodeCgroup = c.CgroupParent + "-node" })
		const disk, outCap = 64 << 20, 1 << 20
		a := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend, Resources: client.Resources{
			CPUMillis: 2000, MemoryBytes: 128 << 20, Pids: 128, DiskBytes: disk}})
		b := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend})
		be := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend, Resources: client.Resources{
			CPUMillis: 2000, BestEffort: true}})
		installProbe(t, a)
		installProbe(t, be)
		// p99 of 1,000 samples is the tenth-slowest exec (of 200, the
		// second-slowest: one stall of the shared host's decided it).
		const window, samples = 8 * time.Second, 1000
		spin := client.Command{Shell: "for i in 1 2 3 4; do (while :; do :; done) & done; sleep 10", Timeout: 12 * time.Second}
		loads := []load{
			{name: "fork bomb", cmd: client.Command{Shell: "bomb() { bomb | bomb & }; bomb; sleep 10", Timeout: 12 * time.Second},
				check: func(res *client.Result, a, _ *client.Sandbox) []Result {
					out := testenv.Sh(t, a, "echo alive")
					return []Result{check("resource/fork-bomb", out == "alive\n", "bomb ended %+v; sandbox afterwards %q", *res, out)}
				}},
			{name: "memory bomb", cmd: client.Command{Shell: `x=$(head -c 400000000 /dev/zero | tr '\0' a); echo ${#x}`, Timeout: 30 * time.Second},
				check: func(res *client.Result, _, _ *client.Sandbox) []Result {
					return []Result{check("resource/memory-bomb", res.OOMKilled, "result %+v, want OOMKilled", *res)}
				}},
			{name: "disk fill", cmd: client.Command{Shell: "yes > /fill; echo rc=$?", Timeout: 60 * time.Second},
				check: func(res *client.Result, a, b *client.Sandbox) []Result {
					errs := string(res.Stderr) + string(res.Stdout)
					full := strings.Contains(errs, "No space left") || strings.Contains(errs, "quota exceeded")
					other := testenv.Run(t, b, client.Command{Shell: "dd if=/dev/zero of=/other bs=1M count=4 2>&1 && rm /other && echo wrote"})
					testenv.Sh(t, a, "rm -f /fill")
					return []Result{
						check("resource/disk-fill", full, "yes > /fill: %q", errs),
						check("resource/disk-fill-other-writes", strings.Contains(string(other.Stdout), "wrote"), "B: %q", other.Stdout),
					}
				}},
			{name: "yes flood", cmd: client.Command{Shell: "timeout 10 yes", OutputLimit: outCap, Timeout: 12 * time.Second},
				check: func(res *client.Result, _, _ *client.Sandbox) []Result {
					return []Result{check("resource/yes-stdout", res.Truncated && len(res.Stdout)+len(res.Stderr) <= outCap,
						"truncated %v, %d bytes kept (cap %d)", res.Truncated, len(res.Stdout)+len(res.Stderr), outCap)}
				}},
			{name: "cpu spin", cmd: spin},
			{name: "cpu spin, A best-effort", cmd: spin, bestEffort: true},
		}
		first := latency(b, window, samples)
		rows := []string{fmt.Sprintf("%-24s p50 %8v  p99 %8v  host fork/exec p50 %v p99 %v  load %s", "idle",
			us(p50(first.b)), us(p99(first.b)), us(p50(first.host)), us(p99(first.host)), loadAverage())}
		answers, responsive := true, true
		var why []string
		for _, l := range loads {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan *client.Result, 1)
			attacker := a
			if l.bestEffort {
				attacker = be
			}
			// B's idle latency just before each attack: the host's other
			// work drifts over the run (this machine is shared), and a
			// single idle window at the start then decides every ratio.
			idle := latency(b, window, samples)
			go func() {
				res, err := attacker.Run(ctx, l.cmd)
				if err != nil {
					res = &client.Result{ExitCode: -2, Stderr: []byte(err.Error())}
				}
				done <- res
			}()
			time.Sleep(500 * time.Millisecond) // let the attack ramp up
			loaded := latency(b, window, samples)
			lctx, lcancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, listErr := srv.Client.List(lctx, client.ListOptions{})
			lcancel()
			res := <-done
			cancel()
			bRatio := ratio(loaded.b, idle.b)
			verdict := "within 2x"
			if bRatio > 2 {
				verdict = "OVER 2x"
			}
			// The host's own fork/exec in the same windows says what the
			// attack does to the machine, corral aside: when its ratio is
			// over 2× too, the machine bounds B's.
			rows = append(rows, fmt.Sprintf("%-24s p50 %8v  p99 %8v  p99/idle %5.2f  %s  (idle p99 just before %v)  host fork/exec p50 %v p99 %v, p99/idle %.2f  B failures %d  load %s",
				l.name, us(p50(loaded.b)), us(p99(loaded.b)), bRatio, verdict, us(p99(idle.b)),
				us(p50(loaded.host)), us(p99(loaded.host)), ratio(loaded.host, idle.host), loaded.failed, loadAverage()))
			if loaded.failed > 0 || len(loaded.b) == 0 {
				answers = false
				why = append(why, fmt.Sprintf("%s: %d failed execs of B", l.name, loaded.failed))
			}
			if listErr != nil {
				responsive = false
				why = append(why, fmt.Sprintf("%s: List: %v", l.name, listErr))
			}
			if l.check != nil {
				judge(t, backend, l.check(res, a, b))
			}
			clearOut(t, attacker)
		}
		judge(t, backend, []Result{
			check("resource/neighbour-answers", answers, "%v", why),
			check("resource/daemon-responsive", responsive, "%v", why),
		})
		judge(t, backend, runProbe(t, be, nil, "sched"))
		judge(t, backend, runProbe(t, a, nil, "inodes", "/inodes"))
		other := testenv.Run(t, b, client.Command{Shell: "touch /after-inodes && echo ok"})
		judge(t, backend, []Result{check("resource/inodes-other-writes", trim(other.Stdout) == "ok", "B: %q %q", other.Stdout, other.Stderr)})
		report.Logf("noisy neighbours [%s]: sandbox B's `true` exec latency while A attacks (%v windows, 2 cores shared)", backend, window)
		for _, r := range rows {
			report.Logf("  %s", r)
			t.Log(r)
		}
	})
}
