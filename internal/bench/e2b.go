package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/corral-dev/corral/client"
)

// E2BOptions configure E2B. Zero fields take the defaults.
type E2BOptions struct {
	// URL is the server's --e2b-listen address as http://HOST:PORT.
	URL    string
	APIKey string
	// SDKDir holds bench.mjs and the e2b npm package (default test/e2b
	// here, else beside the binary's parent directory).
	SDKDir      string
	N           int           // sequential cycles for the latency (default 30)
	Concurrency int           // loops in flight for cycles/s (default 4)
	Duration    time.Duration // length of each rate phase (default 10 s)
	Image       string        // default "busybox"
	Log         io.Writer
}

func (o *E2BOptions) defaults() {
	ifNotPositive(&o.N, 30)
	ifNotPositive(&o.Concurrency, 4)
	ifNotPositive(&o.Duration, 10*time.Second)
	ifZero(&o.Image, "busybox")
	ifZero(&o.Log, io.Discard)
}

// E2BSide is one client's figures.
type E2BSide struct {
	P50Ms     float64 `json:"cycle_p50_ms"`
	P99Ms     float64 `json:"cycle_p99_ms"`
	CyclesPS  float64 `json:"cycles_per_s"`
	Cycles    int     `json:"cycles"`
	Errors    int     `json:"errors"`
	FirstErr  string  `json:"first_error,omitempty"`
	Samples   int     `json:"samples"`
	RateSecs  float64 `json:"rate_seconds"`
	RateConcN int     `json:"concurrency"`
}

// E2BResult is the outcome of E2B.
type E2BResult struct {
	Image string  `json:"image"`
	E2B   E2BSide `json:"e2b_sdk"`
	Go    E2BSide `json:"go_sdk"`
	// P50Ratio is the e2b SDK's cycle p50 over the Go SDK's (goal <= 1.5);
	// RateRatio the Go SDK's cycles/s over the e2b SDK's.
	P50Ratio  float64  `json:"p50_ratio"`
	RateRatio float64  `json:"rate_ratio"`
	Targets   []Target `json:"targets"`
	Load      Load     `json:"load"`
	Leaked    int      `json:"leaked"`
}

// E2B measures create -> run `true` -> delete through the unchanged e2b
// SDK (node, on the server's E2B API) and, in the same run, through
// corral's Go SDK: sequentially (latency, in alternating halves) and with
// Concurrency in flight (cycles/s). Both run `true` through a shell, as
// commands.run does.
func E2B(ctx context.Context, c *client.Client, o E2BOptions) (res *E2BResult, err error) {
	o.defaults()
	if o.URL == "" || o.APIKey == "" {
		return nil, errors.New("e2b bench: --e2b-url and --e2b-api-key are required (the server's --e2b-listen and --e2b-api-key)")
	}
	dir, err := findE2BSDK(o.SDKDir)
	if err != nil {
		return nil, err
	}
	t := newTracker(c)
	res = &E2BResult{Image: o.Image}
	defer func() { err = t.finish(ctx, &res.Load, &res.Leaked, err) }()
	res.Load.Start, res.Load.CPUs = loadAvg(), runtime.NumCPU()

	// Latency in alternating halves (e2b, Go, Go, e2b), so that a load
	// that drifts during the run weighs on both alike; then each rate.
	half := o
	half.N, half.Duration = (o.N+1)/2, 0
	var e2bLat, goLat []time.Duration
	var e2bErrs, goErrs Errors
	for round := range 2 {
		for _, side := range [][2]string{{"e2b", "go"}, {"go", "e2b"}}[round] {
			fmt.Fprintf(o.Log, "%s sdk: %d sequential cycles\n", side, half.N)
			if side == "go" {
				goLatency(ctx, t, half, &goLat, &goErrs)
				continue
			}
			r, err := e2bSide(ctx, half, dir, t.label)
			if err != nil {
				return res, err
			}
			e2bLat = append(e2bLat, r.latencies...)
			e2bErrs.Count += r.Errors
			if e2bErrs.First == "" {
				e2bErrs.First = r.FirstErr
			}
		}
	}
	fmt.Fprintf(o.Log, "e2b sdk: %d in flight for %s\n", o.Concurrency, o.Duration)
	rate := o
	rate.N = 0
	r, err := e2bSide(ctx, rate, dir, t.label)
	if err != nil {
		return res, err
	}
	res.E2B = r.E2BSide
	res.E2B.Errors += e2bErrs.Count
	if res.E2B.FirstErr == "" {
		res.E2B.FirstErr = e2bErrs.First
	}
	fillLatency(&res.E2B, e2bLat)
	fmt.Fprintf(o.Log, "go sdk: %d in flight for %s\n", o.Concurrency, o.Duration)
	res.Go = goRate(ctx, t, o)
	res.Go.Errors += goErrs.Count
	if res.Go.FirstErr == "" {
		res.Go.FirstErr = goErrs.First
	}
	fillLatency(&res.Go, goLat)
	res.P50Ratio = ratio(res.E2B.P50Ms, res.Go.P50Ms)
	res.RateRatio = ratio(res.Go.CyclesPS, res.E2B.CyclesPS)
	res.Targets = []Target{atMost("p50_ratio", res.P50Ratio, 1.5)}
	return res, ctx.Err()
}

func goCycle(ctx context.Context, t *tracker, image string) error {
	sb, err := t.create(ctx, client.CreateOptions{Image: image})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	defer func() { _ = t.delete(context.WithoutCancel(ctx), sb) }()
	r, err := sb.Run(ctx, client.Command{Shell: "true"})
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("true exited %d", r.ExitCode)
	}
	return err
}

func fillLatency(side *E2BSide, lat []time.Duration) {
	p := Summarise(lat)
	side.P50Ms, side.P99Ms, side.Samples = p.P50, p.P99, len(lat)
}

// goLatency appends the times of o.N sequential Go SDK cycles (after one
// untimed warm-up, as the e2b side does).
func goLatency(ctx context.Context, t *tracker, o E2BOptions, lat *[]time.Duration, errs *Errors) {
	_ = goCycle(ctx, t, o.Image)
	for i := 0; i < o.N && ctx.Err() == nil; i++ {
		t0 := time.Now()
		if err := goCycle(ctx, t, o.Image); err != nil {
			errs.add(err)
			continue
		}
		*lat = append(*lat, time.Since(t0))
	}
}

func goRate(ctx context.Context, t *tracker, o E2BOptions) E2BSide {
	r := sustain(ctx, o.Concurrency, o.Duration, func(ctx context.Context, _, _ int) error { return goCycle(ctx, t, o.Image) })
	return E2BSide{CyclesPS: r.PerS, Cycles: r.Cycles, RateSecs: r.Seconds, RateConcN: o.Concurrency, Errors: r.Errors, FirstErr: r.FirstErr}
}

// e2bRun is one run of bench.mjs.
type e2bRun struct {
	E2BSide
	latencies []time.Duration
}

func e2bSide(ctx context.Context, o E2BOptions, dir, label string) (e2bRun, error) {
	cmd := exec.CommandContext(ctx, "node", "bench.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"E2B_API_KEY="+o.APIKey, "E2B_API_URL="+o.URL, "E2B_SANDBOX_URL="+o.URL, "E2B_TEMPLATE="+o.Image,
		"N="+strconv.Itoa(o.N), "CONCURRENCY="+strconv.Itoa(o.Concurrency),
		"DURATION_MS="+strconv.FormatInt(o.Duration.Milliseconds(), 10), "LABEL="+label)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return e2bRun{}, fmt.Errorf("node bench.mjs: %w: %s", err, stderr.String())
	}
	var r struct {
		Latencies []float64 `json:"latencies_ms"`
		Cycles    int       `json:"cycles"`
		Seconds   float64   `json:"seconds"`
		PerS      float64   `json:"per_s"` // the workers' rates summed, as sustain's
		Errors    int       `json:"errors"`
		FirstErr  string    `json:"first_error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return e2bRun{}, fmt.Errorf("node bench.mjs output %q: %w", out, err)
	}
	run := e2bRun{E2BSide: E2BSide{
		Cycles: r.Cycles, RateSecs: round(r.Seconds), Errors: r.Errors, FirstErr: r.FirstErr, RateConcN: o.Concurrency,
	}}
	run.CyclesPS = round(r.PerS)
	for _, ms := range r.Latencies {
		run.latencies = append(run.latencies, time.Duration(ms*float64(time.Millisecond)))
	}
	return run, nil
}

// searchDirs is where a peer's files are looked for: dir when given, else
// rel in the working directory (a checkout) and rel beside the directory
// that holds this binary's (bin/ of a checkout or an unpacked release).
func searchDirs(dir, rel string) []string {
	if dir != "" {
		return []string{dir}
	}
	dirs := []string{rel}
	if self, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Join(filepath.Dir(filepath.Dir(self)), rel))
	}
	return dirs
}

// findE2BSDK finds the directory with bench.mjs and the installed e2b
// package.
func findE2BSDK(dir string) (string, error) {
	if _, err := exec.LookPath("node"); err != nil {
		return "", fmt.Errorf("e2b bench: node is not installed: %w", err)
	}
	candidates := searchDirs(dir, "test/e2b")
	for _, d := range candidates {
		if _, err := os.Stat(filepath.Join(d, "node_modules", "e2b", "package.json")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("e2b bench: no e2b SDK installed in %v (run `npm ci` in test/e2b, or pass --sdk-dir)", candidates)
}

// WriteTable prints the result as a table, the e2b SDK beside the Go SDK.
func (r *E2BResult) WriteTable(w io.Writer) error {
	side := func(s E2BSide) string {
		return fmt.Sprintf("p99 %s ms, %d samples, %d errors", f3(s.P99Ms), s.Samples, s.Errors)
	}
	return writeTable(w, fmt.Sprintf("corral bench e2b (image %s, load %.1f -> %.1f on %d CPUs, leaked %d)", r.Image, r.Load.Start, r.Load.End, r.Load.CPUs, r.Leaked), []row{
		{"e2b_sdk.cycle_p50_ms", f3(r.E2B.P50Ms), side(r.E2B), ""},
		{"go_sdk.cycle_p50_ms", f3(r.Go.P50Ms), side(r.Go), ""},
		{"p50_ratio (e2b / go)", f3(r.P50Ratio), "", targetFor(r.Targets, "p50_ratio")},
		{"e2b_sdk.cycles_per_s", f3(r.E2B.CyclesPS), fmt.Sprintf("%d cycles, %d in flight", r.E2B.Cycles, r.E2B.RateConcN), ""},
		{"go_sdk.cycles_per_s", f3(r.Go.CyclesPS), fmt.Sprintf("%d cycles, %d in flight", r.Go.Cycles, r.Go.RateConcN), ""},
		{"rate_ratio (go / e2b)", f3(r.RateRatio), "", ""},
	})
}
