package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/client"
)

// ContainerOptions configure Container. Zero fields take the defaults.
type ContainerOptions struct {
	Image       string        // default "busybox"
	N           int           // samples for create→ready and exec (default 50)
	Concurrency int           // workers for the cycle rates (default 8)
	Duration    time.Duration // length of each sustained-cycle phase (default 20s)
	Rootfs      string        // runc peer's rootfs; "" builds a temporary busybox one
	// TCPAddr, when set, also compares create→ready over this TCP
	// listener with a project token against the client's (unix) address.
	TCPAddr string
	Log     io.Writer // progress lines; nil discards
}

func (o *ContainerOptions) defaults() {
	ifZero(&o.Image, "busybox")
	ifNotPositive(&o.N, 50)
	ifNotPositive(&o.Concurrency, 8)
	ifNotPositive(&o.Duration, 20*time.Second)
	ifZero(&o.Log, io.Discard)
}

// Rate is a sustained cycle rate.
type Rate struct {
	Cycles   int     `json:"cycles"`
	Errors   int     `json:"errors"`
	Seconds  float64 `json:"seconds"`
	PerS     float64 `json:"per_s"`
	FirstErr string  `json:"first_error,omitempty"`
}

// ContainerResult is the outcome of Container; *_ms figures are milliseconds.
type ContainerResult struct {
	Image       string  `json:"image"`
	Samples     int     `json:"samples"`
	Concurrency int     `json:"concurrency"`
	DurationS   float64 `json:"duration_s"`

	CreateReadyP50Ms float64     `json:"create_ready_p50_ms"`
	CreateReadyP99Ms float64     `json:"create_ready_p99_ms"`
	CreateReady      Percentiles `json:"create_ready"`
	CreateErrors     Errors      `json:"create_ready_errors"`
	// CreateReadyCold is create→ready of creates that no warm pool
	// serves (made from scratch), sampled after CreateReady.
	CreateReadyColdP50Ms float64     `json:"create_ready_cold_p50_ms"`
	CreateReadyCold      Percentiles `json:"create_ready_cold"`

	ExecP50Ms     float64     `json:"exec_p50_ms"`
	ExecP99Ms     float64     `json:"exec_p99_ms"`
	ForkExecP50Ms float64     `json:"fork_exec_p50_ms"`
	ForkExecP99Ms float64     `json:"fork_exec_p99_ms"`
	ExecStream    Percentiles `json:"exec_stream"` // the same through the streaming Exec call
	ExecErrors    Errors      `json:"exec_errors"` // failed Run or Exec samples (retried)

	CyclesPerS     float64  `json:"cycles_per_s"`
	Cycles         Rate     `json:"cycles"`
	RuncCyclesPerS *float64 `json:"runc_cycles_per_s"`
	RuncCycles     *Rate    `json:"runc_cycles,omitempty"`
	RuncReason     string   `json:"runc_reason,omitempty"`
	RatioVsRunc    *float64 `json:"ratio_vs_runc"`
	// WriteCycles are cycles whose command writes a file (a recycling
	// node then renews the sandbox's disk), beside runc running the same;
	// ColdCycles are cycles of creates no warm pool serves (made from
	// scratch, torn down).
	WriteCycles     Rate  `json:"write_cycles"`
	RuncWriteCycles *Rate `json:"runc_write_cycles,omitempty"`
	ColdCycles      Rate  `json:"cold_cycles"`

	// Auth is set with ContainerOptions.TCPAddr.
	Auth *AuthResult `json:"auth,omitempty"`

	Targets []Target `json:"targets"`
	Load    Load     `json:"load"`
	Leaked  int      `json:"leaked"`
}

var (
	trueCmd  = client.Command{Args: []string{"true"}}
	writeCmd = client.Command{Args: []string{"sh", "-c", "echo x > /tmp/f"}}
	// runcWriteArgs write to runc's one writable place: its peer's rootfs
	// is read-only and shared, so it never gets a fresh writable layer,
	// which every corral cycle above does.
	runcWriteArgs = []string{"sh", "-c", "echo x > /dev/shm/f"}
)

// Container measures the container backend's lifecycle and exec latency
// against runc and a host fork/exec, in this order: create→ready
// (sequential), exec in one sandbox beside host fork/exec, corral cycles
// alternating with runc cycles (see alternate), cycles made from scratch.
// Every sandbox it made is deleted before it returns.
func Container(ctx context.Context, c *client.Client, o ContainerOptions) (res *ContainerResult, err error) {
	o.defaults()
	t := newTracker(c)
	res = &ContainerResult{Image: o.Image, Samples: o.N, Concurrency: o.Concurrency, DurationS: o.Duration.Seconds()}
	defer func() { err = t.finish(ctx, &res.Load, &res.Leaked, err) }()
	res.Load.Start, res.Load.CPUs = loadAvg(), runtime.NumCPU()
	create := client.CreateOptions{Image: o.Image}

	fmt.Fprintf(o.Log, "create→ready: %d sequential samples\n", o.N)
	ready, err := createReady(ctx, t, create, o.N, &res.CreateErrors)
	if err != nil {
		return res, err
	}
	res.CreateReady = Summarise(ready)
	res.CreateReadyP50Ms, res.CreateReadyP99Ms = res.CreateReady.P50, res.CreateReady.P99

	// The peer: the same creates made from scratch (fresh: no pooled or
	// recycled sandbox, and each delete tears its sandbox down).
	fmt.Fprintf(o.Log, "create→ready made from scratch (no pooled sandbox): %d sequential samples\n", o.N)
	cold := create
	cold.Fresh = true
	coldReady, err := createReady(ctx, t, cold, o.N, &res.CreateErrors)
	if err != nil {
		return res, err
	}
	res.CreateReadyCold = Summarise(coldReady)
	res.CreateReadyColdP50Ms = res.CreateReadyCold.P50

	if o.TCPAddr != "" {
		fmt.Fprintf(o.Log, "create→ready over TCP %s with a project token vs the unix socket: %d samples each, interleaved\n", o.TCPAddr, o.N)
		if res.Auth, err = measureAuth(ctx, t, o); err != nil {
			return res, fmt.Errorf("auth comparison: %w", err)
		}
	}

	fmt.Fprintf(o.Log, "exec: %d samples in one sandbox, and host fork/exec of /bin/true\n", o.N)
	if err := measureExec(ctx, t, create, o.N, res); err != nil {
		return res, err
	}

	fmt.Fprintf(o.Log, "corral cycles (create, true, delete) and runc cycles (runc run true), alternating: %d workers for %s each\n", o.Concurrency, o.Duration)
	res.Cycles, res.RuncCycles, res.RuncReason = againstRunc(ctx, o, cycles(o.Concurrency, cycleOf(t, create, trueCmd)), trueCmd.Args, t.label)
	res.CyclesPerS = res.Cycles.PerS
	if runc := res.RuncCycles; runc != nil {
		res.RuncCyclesPerS = &runc.PerS
		if runc.PerS > 0 {
			r := round(res.CyclesPerS / runc.PerS)
			res.RatioVsRunc = &r
		}
	}
	if res.RuncCycles != nil {
		fmt.Fprintf(o.Log, "corral cycles writing a file (create, sh -c 'echo x > /tmp/f', delete) and runc's writing /dev/shm/f, alternating: %d workers for %s each\n", o.Concurrency, o.Duration)
		res.WriteCycles, res.RuncWriteCycles, _ = againstRunc(ctx, o, cycles(o.Concurrency, cycleOf(t, create, writeCmd)), runcWriteArgs, t.label)
	} else {
		fmt.Fprintf(o.Log, "corral cycles writing a file (create, sh -c 'echo x > /tmp/f', delete): %d workers for %s\n", o.Concurrency, o.Duration)
		res.WriteCycles = sustain(ctx, o.Concurrency, o.Duration, cycleOf(t, create, writeCmd))
	}
	fmt.Fprintf(o.Log, "corral cycles made from scratch (no pooled sandbox): %d workers for %s\n", o.Concurrency, o.Duration)
	res.ColdCycles = sustain(ctx, o.Concurrency, o.Duration, cycleOf(t, cold, trueCmd))
	res.Targets = containerTargets(res)
	return res, ctx.Err()
}

// cycleOf is one create, cmd, delete cycle.
func cycleOf(t *tracker, create client.CreateOptions, cmd client.Command) func(ctx context.Context, _, _ int) error {
	return func(ctx context.Context, _, _ int) error {
		sb, err := t.create(ctx, create)
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		r, rerr := sb.Run(ctx, cmd)
		if rerr == nil && r.ExitCode != 0 {
			rerr = fmt.Errorf("%q in %s: exit code %d", cmd.Args, sb.ID(), r.ExitCode)
		}
		return errors.Join(rerr, t.delete(ctx, sb))
	}
}

// createReady times n sequential creates until a first `true` has run,
// deleting each (untimed).
func createReady(ctx context.Context, t *tracker, create client.CreateOptions, n int, errs *Errors) ([]time.Duration, error) {
	ready := make([]time.Duration, 0, n)
	for len(ready) < n {
		if err := ctx.Err(); err != nil {
			return ready, err
		}
		if err := errs.tooMany(n); err != nil {
			return ready, err
		}
		start := time.Now()
		sb, err := t.create(ctx, create)
		if err != nil {
			errs.add(fmt.Errorf("create: %w", err))
			continue
		}
		err = runTrue(ctx, sb)
		if err == nil {
			ready = append(ready, time.Since(start))
		}
		errs.add(errors.Join(err, t.delete(ctx, sb)))
	}
	return ready, nil
}

func runTrue(ctx context.Context, sb *client.Sandbox) error {
	return trueThrough(ctx, sb, sb.Run, "run")
}

func execTrue(ctx context.Context, sb *client.Sandbox) error {
	return trueThrough(ctx, sb, sb.Exec, "exec (streaming)")
}

// trueThrough runs `true` in sb with run (Run or Exec, named what in errors).
func trueThrough(ctx context.Context, sb *client.Sandbox, run func(context.Context, client.Command) (*client.Result, error), what string) error {
	r, err := run(ctx, trueCmd)
	if err != nil {
		return fmt.Errorf("%s true in %s: %w", what, sb.ID(), err)
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("%s true in %s: exit code %d", what, sb.ID(), r.ExitCode)
	}
	return nil
}

// measureExec times `true` in one running sandbox through Run and through
// the streaming Exec, and a host fork/exec of /bin/true, n samples each,
// interleaved so that all three see the same machine.
func measureExec(ctx context.Context, t *tracker, create client.CreateOptions, n int, res *ContainerResult) error {
	var sb *client.Sandbox
	defer func() {
		if sb != nil {
			_ = t.delete(ctx, sb)
		}
	}()
	var run, stream, fork []time.Duration
	for len(run) < n {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := res.ExecErrors.tooMany(n); err != nil {
			return err
		}
		if sb == nil { // a fresh sandbox, warmed up untimed
			var err error
			if sb, err = t.create(ctx, create); err != nil {
				return fmt.Errorf("create: %w", err)
			}
			if err := runTrue(ctx, sb); err != nil {
				res.ExecErrors.add(err)
				_ = t.delete(ctx, sb)
				sb = nil
				continue
			}
		}
		start := time.Now()
		err := runTrue(ctx, sb)
		d := time.Since(start)
		if err == nil {
			start = time.Now()
			err = execTrue(ctx, sb)
			stream = append(stream, time.Since(start))
		}
		if err != nil {
			// Kept: a failed exec need not mean a dead sandbox; if it is,
			// tooMany ends the loop.
			res.ExecErrors.add(err)
			continue
		}
		run = append(run, d)

		start = time.Now()
		if err := exec.CommandContext(ctx, "/bin/true").Run(); err != nil {
			return fmt.Errorf("host /bin/true: %w", err)
		}
		fork = append(fork, time.Since(start))
	}
	e, f := Summarise(run), Summarise(fork)
	res.ExecP50Ms, res.ExecP99Ms = e.P50, e.P99
	res.ForkExecP50Ms, res.ForkExecP99Ms = f.P50, f.P99
	res.ExecStream = Summarise(stream)
	return nil
}

// Errors counts failed samples, keeping the first message. A failed sample
// is retried, so the figures are over successful ones only.
type Errors struct {
	Count int    `json:"count"`
	First string `json:"first,omitempty"`
}

func (e *Errors) add(err error) {
	if err == nil {
		return
	}
	if e.Count == 0 {
		e.First = err.Error()
	}
	e.Count++
}

// tooMany gives up once as many samples failed as were asked for.
func (e *Errors) tooMany(n int) error {
	if e.Count >= max(n, 1) {
		return fmt.Errorf("%d failed samples, first: %s", e.Count, e.First)
	}
	return nil
}

// sustain runs cycle on conc workers until d has passed (a cycle in flight
// then finishes). The rate is the sum of the workers' own rates, each its
// completed cycles over the time to the end of its last cycle: the workers
// stop one by one, and the completed cycles over the wall time to the last
// one's end would charge each worker about half a cycle, which for runc
// run's 0.1 s cycles is about 1% of a 5 s phase and for corral's
// millisecond calls nothing.
func sustain(ctx context.Context, conc int, d time.Duration, cycle func(ctx context.Context, worker, seq int) error) Rate {
	var failed atomic.Int64
	var once sync.Once
	var first string
	start := time.Now()
	deadline := start.Add(d)
	done := make([]int, conc)
	busy := make([]time.Duration, conc)
	var wg sync.WaitGroup
	for w := range conc {
		wg.Go(func() {
			for seq := 0; time.Now().Before(deadline) && ctx.Err() == nil; seq++ {
				err := cycle(ctx, w, seq)
				busy[w] = time.Since(start)
				if err != nil {
					failed.Add(1)
					once.Do(func() { first = err.Error() })
					continue
				}
				done[w]++
			}
		})
	}
	wg.Wait()
	r := Rate{Errors: int(failed.Load()), Seconds: round(time.Since(start).Seconds()), FirstErr: first}
	var perS float64
	for w := range conc {
		r.Cycles += done[w]
		if busy[w] > 0 {
			perS += float64(done[w]) / busy[w].Seconds()
		}
	}
	r.PerS = round(perS)
	return r
}

func containerTargets(r *ContainerResult) []Target {
	ts := []Target{
		atMost("create_ready_p50_ms", r.CreateReadyP50Ms, 10),
		atLeast("cycles_per_s", r.CyclesPerS, 100),
		atMost("exec_p50_ms", r.ExecP50Ms, 1.5),
	}
	if r.Auth != nil {
		ts = append(ts, atMost("auth_overhead_p50_ms", r.Auth.OverheadP50Ms, 0.5))
	}
	ratio := Target{Figure: "ratio_vs_runc", Op: "at_least", Limit: 5}
	if r.RatioVsRunc != nil {
		ratio = atLeast("ratio_vs_runc", *r.RatioVsRunc, 5)
	} else {
		ratio.Skipped = r.RuncReason
	}
	return append(ts, ratio)
}

// WriteTable prints the result as a table, each figure beside its peer.
func (r *ContainerResult) WriteTable(w io.Writer) error {
	runc, ratio := "n/a: "+r.RuncReason, "n/a"
	if r.RuncCyclesPerS != nil {
		runc = fmt.Sprintf("runc run: %s/s (%d cycles, %d errors)", f3(*r.RuncCyclesPerS), r.RuncCycles.Cycles, r.RuncCycles.Errors)
	}
	if r.RatioVsRunc != nil {
		ratio = f3(*r.RatioVsRunc) + "x"
	}
	runcWrite := "n/a"
	if w := r.RuncWriteCycles; w != nil {
		runcWrite = fmt.Sprintf("runc run writing /dev/shm (read-only rootfs): %s/s (%s)", f3(w.PerS), ratioOf(r.WriteCycles.PerS, w.PerS))
	}
	rows := []row{
		{"create→ready p50", f3(r.CreateReadyP50Ms) + " ms", "", targetFor(r.Targets, "create_ready_p50_ms")},
		{"create→ready p99", f3(r.CreateReadyP99Ms) + " ms", "", ""},
		{"create→ready p50, made from scratch", f3(r.CreateReadyColdP50Ms) + " ms", "p99 " + f3(r.CreateReadyCold.P99) + " ms (fresh creates: no pool serves them)", ""},
		{"cycles/s (create+true+delete)", fmt.Sprintf("%s/s (%d cycles, %d errors)", f3(r.CyclesPerS), r.Cycles.Cycles, r.Cycles.Errors), runc, targetFor(r.Targets, "cycles_per_s")},
		{"ratio vs runc", ratio, "", targetFor(r.Targets, "ratio_vs_runc")},
		{"cycles/s writing a file", fmt.Sprintf("%s/s (%d cycles, %d errors)", f3(r.WriteCycles.PerS), r.WriteCycles.Cycles, r.WriteCycles.Errors), runcWrite, ""},
		{"cycles/s made from scratch", fmt.Sprintf("%s/s (%d cycles, %d errors)", f3(r.ColdCycles.PerS), r.ColdCycles.Cycles, r.ColdCycles.Errors), "fresh creates: made from scratch, torn down", ""},
		{"exec true p50 (sequential: one in flight)", f3(r.ExecP50Ms) + " ms", "fork/exec: " + f3(r.ForkExecP50Ms) + " ms", targetFor(r.Targets, "exec_p50_ms")},
		{"exec true p99", f3(r.ExecP99Ms) + " ms", "fork/exec: " + f3(r.ForkExecP99Ms) + " ms", ""},
		{"exec true p50 (streaming Exec)", f3(r.ExecStream.P50) + " ms", "", ""},
		{"leaked sandboxes", fmt.Sprint(r.Leaked), "", "0"},
	}
	if a := r.Auth; a != nil {
		rows = append(rows,
			row{"create→ready p50, TCP + token", f3(a.TCPTokenP50Ms) + " ms", "unix socket: " + f3(a.UnixP50Ms) + " ms", ""},
			row{"create→ready p99, TCP + token", f3(a.TCPToken.P99) + " ms", "unix socket: " + f3(a.Unix.P99) + " ms", ""},
			row{"auth overhead (p50 difference)", f3(a.OverheadP50Ms) + " ms", "", targetFor(r.Targets, "auth_overhead_p50_ms")})
	}
	title := fmt.Sprintf("corral bench container: image %s, %d samples, %d workers for %gs per rate",
		r.Image, r.Samples, r.Concurrency, r.DurationS)
	if err := writeTable(w, title, rows); err != nil {
		return err
	}
	fmt.Fprintln(w, r.Load)
	for _, e := range []struct {
		what string
		e    Errors
	}{{"create→ready", r.CreateErrors}, {"exec", r.ExecErrors}} {
		if e.e.Count > 0 {
			fmt.Fprintf(w, "%s: %d failed samples (retried), first: %s\n", e.what, e.e.Count, e.e.First)
		}
	}
	for _, c := range []struct {
		what string
		r    Rate
	}{{"corral cycle", r.Cycles}, {"corral cycle writing a file", r.WriteCycles}, {"corral cycle made from scratch", r.ColdCycles}} {
		if c.r.FirstErr != "" {
			fmt.Fprintf(w, "first %s error: %s\n", c.what, c.r.FirstErr)
		}
	}
	return nil
}

// ratioOf formats a/b as "N.NNNx".
func ratioOf(a, b float64) string {
	if b <= 0 {
		return "n/a"
	}
	return f3(a/b) + "x"
}
