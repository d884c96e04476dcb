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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/client"
)

// SDKOptions configure SDK. Zero fields take the defaults.
type SDKOptions struct {
	Concurrency []int  // episodes in flight, one measurement each (default 64, 256)
	Episodes    int    // per concurrency; 0 means 2 x concurrency
	Image       string // default "busybox"
	// Addr is the server address handed to the Python bench (the Go side
	// uses the client it is given).
	Addr string
	// Python is the interpreter for the Python peer; "" skips it.
	Python string
	// PythonPath holds the corral package (default: sdk/python in the
	// working directory, else beside the binary's parent directory).
	PythonPath string
	Log        io.Writer // progress lines; nil discards
}

func (o *SDKOptions) defaults() {
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{64, 256}
	}
	ifZero(&o.Image, "busybox")
	ifZero(&o.Log, io.Discard)
}

// SDKRate is one SDK's rollout rate at one concurrency.
type SDKRate struct {
	Episodes     int     `json:"episodes"`
	Solved       int     `json:"solved"`
	Errors       int     `json:"errors"`
	Seconds      float64 `json:"seconds"`
	RolloutsPerS float64 `json:"rollouts_per_s"`
	FirstErr     string  `json:"first_error,omitempty"`
}

// SDKPoint compares the Go and Python SDKs at one concurrency.
type SDKPoint struct {
	Concurrency int      `json:"concurrency"`
	Go          SDKRate  `json:"go"`
	Python      *SDKRate `json:"python,omitempty"`
	// RatioPythonVsGo is Python's rollouts/s over Go's (nil: not measured).
	RatioPythonVsGo *float64 `json:"ratio_python_vs_go"`
}

// SDKResult is the outcome of SDK.
type SDKResult struct {
	Image        string     `json:"image"`
	Points       []SDKPoint `json:"points"`
	PythonReason string     `json:"python_reason,omitempty"` // why Python was not measured
	Targets      []Target   `json:"targets"`
	Load         Load       `json:"load"`
	Leaked       int        `json:"leaked"`
}

// SDK runs the Python SDK README's rollout episode (create a 64 MiB
// sandbox, write a task file, run three commands, read the answer, score,
// delete) through the Go SDK and, in the same run, through the Python SDK
// (python3 -m corral.bench as a subprocess), at each concurrency in turn.
func SDK(ctx context.Context, c *client.Client, o SDKOptions) (res *SDKResult, err error) {
	o.defaults()
	t := newTracker(c)
	res = &SDKResult{Image: o.Image}
	defer func() { err = t.finish(ctx, &res.Load, &res.Leaked, err) }()
	res.Load.Start, res.Load.CPUs = loadAvg(), runtime.NumCPU()
	python, pypath, reason := findPythonSDK(ctx, o)
	res.PythonReason = reason
	for _, conc := range o.Concurrency {
		if conc <= 0 {
			return res, fmt.Errorf("concurrency %d: must be positive", conc)
		}
		n := o.Episodes
		if n <= 0 {
			n = 2 * conc
		}
		p := SDKPoint{Concurrency: conc}
		fmt.Fprintf(o.Log, "go rollouts: %d episodes, %d in flight\n", n, conc)
		p.Go = goRollouts(ctx, t, o.Image, conc, n)
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if python != "" {
			py, err := pythonRollouts(ctx, o, python, pypath, t.label, conc, n)
			if err != nil {
				return res, fmt.Errorf("python bench: %w", err)
			}
			p.Python = py
			if p.Go.RolloutsPerS > 0 {
				r := round(py.RolloutsPerS / p.Go.RolloutsPerS)
				p.RatioPythonVsGo = &r
			}
		}
		res.Points = append(res.Points, p)
	}
	res.Targets = sdkTargets(res)
	return res, ctx.Err()
}

// goRollouts runs n episodes on conc goroutines and reports the rate of
// solved ones over the wall time.
func goRollouts(ctx context.Context, t *tracker, image string, conc, n int) SDKRate {
	var solved, failed atomic.Int64
	var once sync.Once
	var first string
	start := time.Now()
	parallel(ctx, n, conc, func(ctx context.Context, i int) {
		ok, err := sdkEpisode(ctx, t, image, 1000+i)
		switch {
		case err != nil:
			failed.Add(1)
			once.Do(func() { first = err.Error() })
		case ok:
			solved.Add(1)
		}
	})
	secs := time.Since(start).Seconds()
	return SDKRate{
		Episodes: n, Solved: int(solved.Load()), Errors: int(failed.Load()), Seconds: round(secs),
		RolloutsPerS: round(float64(solved.Load()) / secs), FirstErr: first,
	}
}

// sdkEpisode is the episode of corral.bench.episode in the Python SDK:
// the task is to sum 1..n, scored from the answer file.
func sdkEpisode(ctx context.Context, t *tracker, image string, n int) (bool, error) {
	idle := 10 * time.Minute
	sb, err := t.create(ctx, client.CreateOptions{
		Image: image, Resources: client.Resources{MemoryBytes: 64 << 20}, IdleTimeout: &idle,
	})
	if err != nil {
		return false, fmt.Errorf("create: %w", err)
	}
	defer func() { _ = t.delete(context.WithoutCancel(ctx), sb) }()
	f := sb.Files()
	if err := f.Write(ctx, "/tmp/task/n.txt", []byte(strconv.Itoa(n)+"\n")); err != nil {
		return false, fmt.Errorf("write task: %w", err)
	}
	for _, cmd := range []client.Command{
		{Shell: "mkdir -p /tmp/work && cp /tmp/task/n.txt /tmp/work/"},
		{Args: []string{"sh", "-c", `n=$(cat n.txt); echo $((n * (n + 1) / 2)) > answer.txt`}, Dir: "/tmp/work", Timeout: 30 * time.Second},
		{Args: []string{"ls", "/tmp/work"}},
	} {
		r, err := sb.Run(ctx, cmd)
		if err != nil {
			return false, fmt.Errorf("run %v%s: %w", cmd.Args, cmd.Shell, err)
		}
		if r.ExitCode != 0 {
			return false, fmt.Errorf("run %v%s: exit code %d: %s", cmd.Args, cmd.Shell, r.ExitCode, r.Stderr)
		}
	}
	answer, err := f.Read(ctx, "/tmp/work/answer.txt")
	if err != nil {
		return false, fmt.Errorf("read answer: %w", err)
	}
	got, err := strconv.Atoi(strings.TrimSpace(string(answer)))
	return err == nil && got == n*(n+1)/2, nil
}

// findPythonSDK resolves the interpreter and a PYTHONPATH under which
// `import corral.bench` works, or says why not.
func findPythonSDK(ctx context.Context, o SDKOptions) (python, pypath, reason string) {
	if o.Python == "" {
		return "", "", "no --python given"
	}
	python, err := exec.LookPath(o.Python)
	if err != nil {
		return "", "", fmt.Sprintf("python %q: %v", o.Python, err)
	}
	var tried []string
	for _, dir := range searchDirs(o.PythonPath, "sdk/python") {
		abs, err := filepath.Abs(dir)
		if err != nil {
			continue
		}
		cmd := exec.CommandContext(ctx, python, "-c", "import corral.bench")
		cmd.Env = append(os.Environ(), "PYTHONPATH="+abs)
		if out, err := cmd.CombinedOutput(); err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v: %s", abs, err, lastLine(out)))
			continue
		}
		return python, abs, ""
	}
	return "", "", fmt.Sprintf("%s cannot import corral.bench (tried %s)", python, strings.Join(tried, "; "))
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// pythonRollouts runs `python3 -m corral.bench --json` for one concurrency,
// with the run's label so that the final sweep also covers its sandboxes.
func pythonRollouts(ctx context.Context, o SDKOptions, python, pypath, label string, conc, n int) (*SDKRate, error) {
	cmd := exec.CommandContext(ctx, python, "-m", "corral.bench", "--json",
		"--addr", o.Addr, "--image", o.Image, "--label", label,
		"--concurrency", strconv.Itoa(conc), "--episodes", strconv.Itoa(n))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pypath)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, o.Log
	runErr := cmd.Run() // exits 1 when an episode failed; the JSON still says how
	var out struct {
		Results []struct {
			SDKRate
			Leaked int `json:"leaked"`
		} `json:"results"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || len(out.Results) != 1 {
		return nil, fmt.Errorf("%s -m corral.bench: %v, output %q", python, errors.Join(runErr, err), stdout.String())
	}
	r := out.Results[0].SDKRate
	return &r, nil
}

func sdkTargets(r *SDKResult) []Target {
	var ts []Target
	for _, p := range r.Points {
		name := fmt.Sprintf("ratio_python_vs_go@%d", p.Concurrency)
		if p.RatioPythonVsGo == nil {
			reason := r.PythonReason
			if reason == "" {
				reason = "go completed no rollout: " + p.Go.FirstErr
			}
			ts = append(ts, Target{Figure: name, Op: "at_least", Limit: 0.7, Skipped: reason})
			continue
		}
		ts = append(ts, atLeast(name, *p.RatioPythonVsGo, 0.7))
	}
	return ts
}

// WriteTable prints the result as a table, Python beside Go per concurrency.
func (r *SDKResult) WriteTable(w io.Writer) error {
	var rows []row
	for _, p := range r.Points {
		goRate := fmt.Sprintf("%s/s (%d episodes, %d errors)", f3(p.Go.RolloutsPerS), p.Go.Episodes, p.Go.Errors)
		py, ratio := "n/a: "+r.PythonReason, "n/a"
		if p.Python != nil {
			py = fmt.Sprintf("python: %s/s (%d episodes, %d errors)", f3(p.Python.RolloutsPerS), p.Python.Episodes, p.Python.Errors)
		}
		if p.RatioPythonVsGo != nil {
			ratio = f3(*p.RatioPythonVsGo) + "x"
		}
		name := fmt.Sprintf("ratio_python_vs_go@%d", p.Concurrency)
		rows = append(rows,
			row{fmt.Sprintf("rollouts_per_s go @%d", p.Concurrency), goRate, py, ""},
			row{fmt.Sprintf("ratio python vs go @%d", p.Concurrency), ratio, "", targetFor(r.Targets, name)},
		)
	}
	rows = append(rows, row{"leaked sandboxes", fmt.Sprint(r.Leaked), "", "0"})
	title := fmt.Sprintf("corral bench sdk: image %s, episode = create + 3 commands + file write/read + delete", r.Image)
	if err := writeTable(w, title, rows); err != nil {
		return err
	}
	fmt.Fprintln(w, r.Load)
	for _, p := range r.Points {
		if p.Go.FirstErr != "" {
			fmt.Fprintf(w, "first go error @%d: %s\n", p.Concurrency, p.Go.FirstErr)
		}
		if p.Python != nil && p.Python.FirstErr != "" {
			fmt.Fprintf(w, "first python error @%d: %s\n", p.Concurrency, p.Python.FirstErr)
		}
	}
	return nil
}
