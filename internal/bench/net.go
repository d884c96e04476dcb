package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/probeproto"
)

// NetOptions configure Net. The caller provides the network: a server whose
// sandboxes reach URL when Allow is their allowlist, and HostRun, which runs
// a command on the node's side of that network (the peer).
type NetOptions struct {
	Image       string        // default "busybox"
	N           int           // creates per mode (default 30)
	Duration    time.Duration // length of each load round (default 3s)
	Rounds      int           // load rounds per side, alternating (default 3)
	Concurrency int           // connections of the load (default 8)
	// Probe is the host path of the static corral-probe, the load generator
	// run in the sandbox and on the host alike.
	Probe string
	// URL is the test server; Allow the rules that reach it.
	URL   string
	Allow []string
	// HostRun runs argv on the node's side of the network and returns its
	// stdout.
	HostRun func(ctx context.Context, argv []string) ([]byte, error)
	Log     io.Writer
}

func (o *NetOptions) defaults() {
	ifZero(&o.Image, "busybox")
	ifNotPositive(&o.N, 30)
	ifNotPositive(&o.Duration, 3*time.Second)
	ifNotPositive(&o.Rounds, 3)
	ifNotPositive(&o.Concurrency, 8)
	ifZero(&o.Log, io.Discard)
}

// NetResult is the outcome of Net.
type NetResult struct {
	Image       string  `json:"image"`
	Samples     int     `json:"samples"`
	Concurrency int     `json:"concurrency"`
	DurationS   float64 `json:"round_s"`

	// CreateReadyP50Ms is create→ready with an allowlist; the peer is the
	// same create with network none, interleaved in the same run.
	CreateReadyP50Ms     float64     `json:"create_ready_p50_ms"`
	CreateReadyNoneP50Ms float64     `json:"create_ready_none_p50_ms"`
	CreateRatio          float64     `json:"create_ratio"`
	CreateReady          Percentiles `json:"create_ready"`
	CreateReadyNone      Percentiles `json:"create_ready_none"`

	// SandboxReqPerS is HTTP requests/s from inside an allowlisted sandbox
	// (veth, bridge, NAT, eBPF) to the test server; HostReqPerS the same
	// load from the node's side; ThroughputRatio the first over the second
	// (medians of the rounds).
	SandboxReqPerS  float64                 `json:"sandbox_req_per_s"`
	HostReqPerS     float64                 `json:"host_req_per_s"`
	ThroughputRatio float64                 `json:"throughput_ratio"`
	SandboxRounds   []probeproto.LoadResult `json:"sandbox_rounds"`
	HostRounds      []probeproto.LoadResult `json:"host_rounds"`

	Leaked  int      `json:"leaked_sandboxes"`
	Load    Load     `json:"load"`
	Targets []Target `json:"targets"`
}

// Net measures what a network policy costs: create→ready with an allowlist
// against network none, and HTTP throughput from a sandbox against the
// same load from the host.
func Net(ctx context.Context, c *client.Client, o NetOptions) (res *NetResult, err error) {
	o.defaults()
	if o.Probe == "" || o.URL == "" || o.HostRun == nil {
		return nil, errors.New("bench net: Probe, URL and HostRun are required")
	}
	probe, err := os.ReadFile(o.Probe)
	if err != nil {
		return nil, fmt.Errorf("bench net: the load generator: %w", err)
	}
	t := newTracker(c)
	res = &NetResult{Image: o.Image, Samples: o.N, Concurrency: o.Concurrency, DurationS: o.Duration.Seconds(),
		Load: Load{Start: loadAvg(), CPUs: runtime.NumCPU()}}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		err = t.finish(cctx, &res.Load, &res.Leaked, err)
		if err != nil {
			res = nil
		}
	}()
	allow := client.Network{Mode: client.NetworkAllowlist, Allow: o.Allow}
	// The first networked create sets up the node side: not a sample.
	if _, err := timedCreate(ctx, t, o.Image, allow); err != nil {
		return res, fmt.Errorf("bench net: warm-up: %w", err)
	}
	var none, listed []time.Duration
	for i := range o.N {
		// Alternate the order, so neither mode always follows the other.
		modes := []client.Network{{}, allow}
		if i%2 == 1 {
			slices.Reverse(modes)
		}
		for _, nw := range modes {
			d, err := timedCreate(ctx, t, o.Image, nw)
			if err != nil {
				return res, fmt.Errorf("bench net: create (%s): %w", nw.Mode, err)
			}
			if nw.Mode == "" {
				none = append(none, d)
			} else {
				listed = append(listed, d)
			}
		}
		if (i+1)%10 == 0 {
			fmt.Fprintf(o.Log, "create: %d/%d per mode\n", i+1, o.N)
		}
	}
	res.CreateReady, res.CreateReadyNone = Summarise(listed), Summarise(none)
	res.CreateReadyP50Ms, res.CreateReadyNoneP50Ms = res.CreateReady.P50, res.CreateReadyNone.P50
	if res.CreateReadyNoneP50Ms > 0 {
		res.CreateRatio = round(res.CreateReadyP50Ms / res.CreateReadyNoneP50Ms)
	}

	sb, err := t.create(ctx, client.CreateOptions{Image: o.Image, Network: allow,
		Resources: client.Resources{CPUMillis: int64(runtime.NumCPU()) * 1000, MemoryBytes: 512 << 20}})
	if err != nil {
		return res, fmt.Errorf("bench net: create the load sandbox: %w", err)
	}
	if _, err := sb.Files().WriteFrom(ctx, "/tmp/corral-probe", bytes.NewReader(probe), 0o755); err != nil {
		return res, fmt.Errorf("bench net: copy the load generator: %w", err)
	}
	args := []string{"httpload", o.URL, strconv.FormatFloat(o.Duration.Seconds(), 'f', -1, 64), strconv.Itoa(o.Concurrency)}
	for i := range o.Rounds {
		out, err := o.HostRun(ctx, append([]string{o.Probe}, args...))
		if err != nil {
			return res, fmt.Errorf("bench net: host load: %w", err)
		}
		h, err := parseRound(out)
		if err != nil {
			return res, fmt.Errorf("bench net: host load: %w", err)
		}
		r, err := sb.Run(ctx, client.Command{Args: append([]string{"/tmp/corral-probe"}, args...), Timeout: o.Duration + time.Minute})
		if err != nil {
			return res, fmt.Errorf("bench net: sandbox load: %w", err)
		}
		if r.ExitCode != 0 {
			return res, fmt.Errorf("bench net: sandbox load exited %d: %s", r.ExitCode, r.Stderr)
		}
		s, err := parseRound(r.Stdout)
		if err != nil {
			return res, fmt.Errorf("bench net: sandbox load: %w", err)
		}
		res.HostRounds, res.SandboxRounds = append(res.HostRounds, h), append(res.SandboxRounds, s)
		fmt.Fprintf(o.Log, "load round %d/%d: sandbox %.0f req/s, host %.0f req/s\n", i+1, o.Rounds, s.PerS, h.PerS)
	}
	res.SandboxReqPerS, res.HostReqPerS = medianRate(res.SandboxRounds), medianRate(res.HostRounds)
	if res.HostReqPerS > 0 {
		res.ThroughputRatio = round(res.SandboxReqPerS / res.HostReqPerS)
	}
	res.Targets = []Target{atMost("create_ratio", res.CreateRatio, 1.25), atLeast("throughput_ratio", res.ThroughputRatio, 0.8)}
	return res, nil
}

// timedCreate measures one create→ready and deletes the sandbox (untimed).
func timedCreate(ctx context.Context, t *tracker, image string, nw client.Network) (time.Duration, error) {
	start := time.Now()
	sb, err := t.create(ctx, client.CreateOptions{Image: image, Network: nw})
	if err != nil {
		return 0, err
	}
	d := time.Since(start)
	return d, t.delete(ctx, sb)
}

func parseRound(out []byte) (probeproto.LoadResult, error) {
	var r probeproto.LoadResult
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
		return r, fmt.Errorf("parse %q: %w", out, err)
	}
	if r.Requests == 0 {
		return r, fmt.Errorf("no request succeeded (%d errors, first: %s)", r.Errors, r.FirstErr)
	}
	return r, nil
}

func medianRate(rs []probeproto.LoadResult) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = r.PerS
	}
	slices.Sort(v)
	return round(v[len(v)/2])
}

// WriteTable prints the result, each figure beside its peer.
func (r *NetResult) WriteTable(w io.Writer) error {
	rows := []row{
		{"create→ready p50 (allowlist)", f3(r.CreateReadyP50Ms) + " ms", "network none: " + f3(r.CreateReadyNoneP50Ms) + " ms", ""},
		{"create ratio (allowlist / none)", f3(r.CreateRatio), "", targetFor(r.Targets, "create_ratio")},
		{"create→ready p99 (allowlist)", f3(r.CreateReady.P99) + " ms", "network none: " + f3(r.CreateReadyNone.P99) + " ms", ""},
		{"HTTP req/s from a sandbox", f3(r.SandboxReqPerS), "from the host: " + f3(r.HostReqPerS), ""},
		{"throughput ratio", f3(r.ThroughputRatio), "", targetFor(r.Targets, "throughput_ratio")},
		{"leaked sandboxes", fmt.Sprint(r.Leaked), "", "0"},
	}
	title := fmt.Sprintf("corral bench net: image %s, %d creates per mode, %d connections for %gs x %d rounds",
		r.Image, r.Samples, r.Concurrency, r.DurationS, len(r.HostRounds))
	if err := writeTable(w, title, rows); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, r.Load)
	return err
}
