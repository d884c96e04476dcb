package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/client"
)

// FnCallOptions configure FnCall.
type FnCallOptions struct {
	Concurrency int           // calls in flight (corral, bare and runc alike)
	Duration    time.Duration // length of each rate phase
	ShImage     string        // image of the sh phase
	PyImage     string        // image of the python phase (needs python3)
	Rootfs      string        // runc peer rootfs ("" builds a busybox one)
	Log         io.Writer
}

func (o *FnCallOptions) defaults() {
	ifNotPositive(&o.Concurrency, 8)
	ifNotPositive(&o.Duration, 10*time.Second)
	ifZero(&o.ShImage, "busybox")
	ifZero(&o.PyImage, "debian")
	ifZero(&o.Log, io.Discard)
}

// CallRate is a sustained call rate with its latencies.
type CallRate struct {
	Rate
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
}

// FnCallResult is the outcome of FnCall.
type FnCallResult struct {
	Concurrency int     `json:"concurrency"`
	DurationS   float64 `json:"duration_s"`

	CallsPerS       float64   `json:"calls_per_s"` // sh -c true
	Sh              CallRate  `json:"sh"`
	ShBatch         CallRate  `json:"sh_batch"` // CallBatch of 64
	PythonCallsPerS *float64  `json:"python_calls_per_s"`
	Python          *CallRate `json:"python,omitempty"`
	PythonReason    string    `json:"python_reason,omitempty"`
	// PythonWarmReusePct is the share of python calls served by a warm
	// python that had served an earlier call (not started for this one).
	PythonWarmReusePct *float64 `json:"python_warm_reuse_pct,omitempty"`
	BareCallsPerS      float64  `json:"bare_calls_per_s"` // host fork+exec of sh -c true
	Bare               CallRate `json:"bare"`
	BarePythonPerS     *float64 `json:"bare_python_calls_per_s"`
	RuncCallsPerS      *float64 `json:"runc_calls_per_s"`
	RuncReason         string   `json:"runc_reason,omitempty"`
	RatioVsBare        float64  `json:"ratio_vs_bare"` // bare / corral: at most 3
	RatioVsRunc        *float64 `json:"ratio_vs_runc"` // corral / runc: at least 20
	PythonRatioVsBare  *float64 `json:"python_ratio_vs_bare,omitempty"`

	Targets []Target `json:"targets"`
	Load    Load     `json:"load"`
}

// pySource is the python call: a small sum, then the identity of the
// interpreter that forked it (pid and start time of its parent), from
// which the bench counts warm-python reuse.
const pySource = "import os\nprint(sum(range(1000)))\n" +
	"print(os.getppid(), open('/proc/%d/stat' % os.getppid()).read().rsplit(')', 1)[1].split()[19])"

// reuse counts python calls whose parent interpreter (a warm python) had
// already served an earlier call; a cold call's parent is the sandbox's
// init (pid 1) and never counts.
type reuse struct {
	mu           sync.Mutex
	seen         map[string]bool
	calls, again int
}

func (u *reuse) note(r *client.CallResult, err error) (*client.CallResult, error) {
	if err != nil || r == nil {
		return r, err
	}
	lines := strings.Split(strings.TrimSpace(string(r.Stdout)), "\n")
	parent := lines[len(lines)-1]
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls++
	if !strings.HasPrefix(parent, "1 ") {
		if u.seen[parent] {
			u.again++
		}
		u.seen[parent] = true
	}
	return r, err
}

func (u *reuse) percent() float64 {
	if u.calls == 0 {
		return 0
	}
	return round(100 * float64(u.again) / float64(u.calls))
}

// FnCall measures fncall call rates through the API (sh and python, one
// Call per call, and sh through CallBatch) against a host fork+exec of the
// same command and `runc run` per call, in one run; the sh calls alternate
// with runc's (see alternate).
func FnCall(ctx context.Context, c *client.Client, o FnCallOptions) (*FnCallResult, error) {
	o.defaults()
	res := &FnCallResult{Concurrency: o.Concurrency, DurationS: o.Duration.Seconds()}
	res.Load.Start, res.Load.CPUs = loadAvg(), runtime.NumCPU()
	sh := client.CallOptions{Image: o.ShImage, Language: "sh", Source: "true"}
	if r, err := c.Call(ctx, sh); err != nil || r.Verdict != client.VerdictOK {
		return nil, fmt.Errorf("fncall bench: first sh call: %v %+v", err, r)
	}
	fmt.Fprintf(o.Log, "sh -c true through Call and runc run per call, alternating, %d in flight for %v each (after a 1s warm-up that sizes the pool)...\n", o.Concurrency, o.Duration)
	shCall := func(ctx context.Context) error { return checkCall(c.Call(ctx, sh)) }
	warmUp(ctx, o, shCall)
	shMeter := &callMeter{conc: o.Concurrency, call: shCall}
	// The peer runs the same command as the corral side.
	shRate, runc, reason := againstRunc(ctx, ContainerOptions{Concurrency: o.Concurrency, Duration: o.Duration, Rootfs: o.Rootfs},
		shMeter.round, []string{"/bin/sh", "-c", "true"}, "fncall")
	res.Sh = shMeter.result(shRate)
	res.CallsPerS = res.Sh.PerS
	if runc != nil {
		res.RuncCallsPerS = &runc.PerS
	}
	res.RuncReason = reason
	fmt.Fprintf(o.Log, "sh -c true through CallBatch(64)...\n")
	res.ShBatch = measureBatch(ctx, c, o, sh, 64)
	py := client.CallOptions{Image: o.PyImage, Language: "python", Source: pySource}
	if err := checkCall(c.Call(ctx, py)); err != nil {
		res.PythonReason = fmt.Sprintf("python call in image %s failed (it needs python3; the built-in debian image has it: corral image build debian): %v", o.PyImage, strings.TrimSpace(err.Error()))
	} else {
		fmt.Fprintf(o.Log, "python3 -c %q through Call...\n", pySource)
		warmUp(ctx, o, func(ctx context.Context) error { return checkCall(c.Call(ctx, py)) })
		u := &reuse{seen: map[string]bool{}}
		r := measureCalls(ctx, o, func(ctx context.Context) error { return checkCall(u.note(c.Call(ctx, py))) })
		res.Python, res.PythonCallsPerS = &r, &r.PerS
		v := u.percent()
		res.PythonWarmReusePct = &v
	}
	fmt.Fprintf(o.Log, "bare fork+exec on the host...\n")
	res.Bare = measureCalls(ctx, o, func(ctx context.Context) error {
		return exec.CommandContext(ctx, "/bin/sh", "-c", "true").Run()
	})
	res.BareCallsPerS = res.Bare.PerS
	if p, err := hostPython(); err == nil {
		r := measureCalls(ctx, o, func(ctx context.Context) error { return exec.CommandContext(ctx, p, "-c", pySource).Run() })
		res.BarePythonPerS = &r.PerS
	}
	res.ratios()
	res.Targets = fncallTargets(res)
	res.Load.End = loadAvg()
	return res, ctx.Err()
}

// warmUp runs calls for a second, unmeasured.
func warmUp(ctx context.Context, o FnCallOptions, call func(ctx context.Context) error) {
	sustain(ctx, o.Concurrency, time.Second, func(ctx context.Context, _, _ int) error { return call(ctx) })
}

// hostPython is the host's python3 for the bare peer: the distribution's
// binary rather than a version manager's shim (a shell script) in PATH.
func hostPython() (string, error) {
	for _, p := range []string{"/usr/bin/python3", "/usr/local/bin/python3"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return exec.LookPath("python3")
}

func checkCall(r *client.CallResult, err error) error {
	if err != nil {
		return err
	}
	if r.Verdict != client.VerdictOK {
		return fmt.Errorf("verdict %s (exit %d): %s", r.Verdict, r.ExitCode, r.Stderr)
	}
	return nil
}

// measureCalls runs call on o.Concurrency workers for o.Duration.
func measureCalls(ctx context.Context, o FnCallOptions, call func(ctx context.Context) error) CallRate {
	m := &callMeter{conc: o.Concurrency, call: call}
	return m.result(m.round(ctx, o.Duration, 0))
}

// measureBatch is measureCalls with CallBatch of n calls; the rate counts
// calls and the latencies are per batch.
func measureBatch(ctx context.Context, c *client.Client, o FnCallOptions, call client.CallOptions, n int) CallRate {
	batch := make([]client.CallOptions, n)
	for i := range batch {
		batch[i] = call
	}
	workers := max(1, o.Concurrency/4)
	r := measureCalls(ctx, FnCallOptions{Concurrency: workers, Duration: o.Duration}, func(ctx context.Context) error {
		rs, err := c.CallBatch(ctx, batch)
		if err != nil {
			return err
		}
		for _, x := range rs {
			if err := checkCall(x, nil); err != nil {
				return err
			}
		}
		return nil
	})
	r.Cycles *= n
	r.PerS = round(r.PerS * float64(n))
	return r
}

func (r *FnCallResult) ratios() {
	if r.CallsPerS > 0 {
		r.RatioVsBare = round(r.BareCallsPerS / r.CallsPerS)
	}
	if r.RuncCallsPerS != nil && *r.RuncCallsPerS > 0 {
		v := round(r.CallsPerS / *r.RuncCallsPerS)
		r.RatioVsRunc = &v
	}
	if r.PythonCallsPerS != nil && r.BarePythonPerS != nil && *r.PythonCallsPerS > 0 {
		v := round(*r.BarePythonPerS / *r.PythonCallsPerS)
		r.PythonRatioVsBare = &v
	}
}

func fncallTargets(r *FnCallResult) []Target {
	ts := []Target{
		atLeast("calls_per_s", r.CallsPerS, 1000),
		atMost("ratio_vs_bare", r.RatioVsBare, 3),
	}
	py := Target{Figure: "python_calls_per_s", Op: "at_least", Limit: 300, Skipped: r.PythonReason}
	if r.PythonCallsPerS != nil {
		py = atLeast("python_calls_per_s", *r.PythonCallsPerS, 300)
	}
	runc := Target{Figure: "ratio_vs_runc", Op: "at_least", Limit: 20, Skipped: r.RuncReason}
	if r.RatioVsRunc != nil {
		runc = atLeast("ratio_vs_runc", *r.RatioVsRunc, 20)
	}
	return append(ts, py, runc)
}

// WriteTable prints the result, each figure beside its peer.
func (r *FnCallResult) WriteTable(w io.Writer) error {
	runc, ratio := "n/a: "+r.RuncReason, "n/a"
	if r.RuncCallsPerS != nil {
		runc = "runc run: " + f3(*r.RuncCallsPerS) + "/s"
	}
	if r.RatioVsRunc != nil {
		ratio = f3(*r.RatioVsRunc) + "x"
	}
	py, pyLat, pyBare := "n/a: "+r.PythonReason, "", ""
	if r.Python != nil {
		py = fmt.Sprintf("%s/s (%d calls, %d errors)", f3(r.Python.PerS), r.Python.Cycles, r.Python.Errors)
		pyLat = fmt.Sprintf("p50 %s ms, p99 %s ms", f3(r.Python.P50Ms), f3(r.Python.P99Ms))
	}
	if r.BarePythonPerS != nil {
		pyBare = "fork+exec: " + f3(*r.BarePythonPerS) + "/s"
	}
	rows := []row{
		{"sh -c true calls/s", fmt.Sprintf("%s/s (%d calls, %d errors)", f3(r.CallsPerS), r.Sh.Cycles, r.Sh.Errors), runc, targetFor(r.Targets, "calls_per_s")},
		{"sh latency", fmt.Sprintf("p50 %s ms, p99 %s ms", f3(r.Sh.P50Ms), f3(r.Sh.P99Ms)), fmt.Sprintf("fork+exec p50 %s ms, p99 %s ms", f3(r.Bare.P50Ms), f3(r.Bare.P99Ms)), ""},
		{"sh calls/s via CallBatch(64)", f3(r.ShBatch.PerS) + "/s", "", ""},
		{"bare fork+exec / corral", f3(r.RatioVsBare) + "x", "fork+exec: " + f3(r.BareCallsPerS) + "/s", targetFor(r.Targets, "ratio_vs_bare")},
		{"corral / runc", ratio, "", targetFor(r.Targets, "ratio_vs_runc")},
		{"python calls/s", py, pyBare, targetFor(r.Targets, "python_calls_per_s")},
		{"python latency", orDash(pyLat), "", ""},
	}
	if r.PythonWarmReusePct != nil {
		rows = append(rows, row{"python calls on a reused warm python", f3(*r.PythonWarmReusePct) + "%", "", ""})
	}
	title := fmt.Sprintf("corral bench fncall: %d calls in flight, %gs per phase", r.Concurrency, r.DurationS)
	if err := writeTable(w, title, rows); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, r.Load)
	return err
}
