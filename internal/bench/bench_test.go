package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	// Reverse so that Summarise must sort (and not mutate the input).
	for i, j := 0, len(ds)-1; i < j; i, j = i+1, j-1 {
		ds[i], ds[j] = ds[j], ds[i]
	}
	s := Summarise(ds)
	if s.N != 100 || s.P50 != 50 || s.P99 != 99 || s.Max != 100 {
		t.Errorf("Summarise(1..100 ms) = %+v, want n 100, p50 50, p99 99, max 100", s)
	}
	if ds[0] != 100*time.Millisecond {
		t.Errorf("Summarise reordered its input")
	}
	for _, tc := range []struct {
		in     []time.Duration
		p      float64
		expect time.Duration
	}{
		{[]time.Duration{7}, 50, 7},
		{[]time.Duration{7}, 99, 7},
		{[]time.Duration{1, 2}, 50, 1},
		{[]time.Duration{1, 2}, 99, 2},
		{[]time.Duration{1, 2, 3}, 50, 2},
		{[]time.Duration{1, 2, 3}, 100, 3},
	} {
		if got := Percentile(tc.in, tc.p); got != tc.expect {
			t.Errorf("Percentile(%v, %g) = %v, want %v", tc.in, tc.p, got, tc.expect)
		}
	}
	if s := Summarise(nil); s != (Percentiles{}) {
		t.Errorf("Summarise(nil) = %+v, want zero", s)
	}
	if got := Summarise([]time.Duration{1500 * time.Microsecond}).P50; got != 1.5 {
		t.Errorf("1.5ms summarised as %v ms", got)
	}
}

// specFixture is the shape `runc spec` writes, cut down, without a network
// namespace so that EditSpec must add one.
const specFixture = `{
  "ociVersion": "1.0.2-dev",
  "process": {"terminal": true, "user": {"uid": 0, "gid": 0}, "args": ["sh"],
              "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "cwd": "/"},
  "root": {"path": "rootfs", "readonly": false},
  "hostname": "runc",
  "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
            "maskedPaths": ["/proc/kcore"]}
}`

type testSpec struct {
	OCIVersion string `json:"ociVersion"`
	Process    struct {
		Terminal bool     `json:"terminal"`
		Args     []string `json:"args"`
		Env      []string `json:"env"`
	} `json:"process"`
	Root struct {
		Path     string `json:"path"`
		Readonly bool   `json:"readonly"`
	} `json:"root"`
	Linux struct {
		Namespaces  []struct{ Type string } `json:"namespaces"`
		MaskedPaths []string                `json:"maskedPaths"`
	} `json:"linux"`
}

func TestEditSpec(t *testing.T) {
	out, err := EditSpec([]byte(specFixture), "/tmp/rootfs", []string{"true"})
	if err != nil {
		t.Fatal(err)
	}
	var s testSpec
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatal(err)
	}
	if s.Root.Path != "/tmp/rootfs" || !s.Root.Readonly {
		t.Errorf("root = %+v, want /tmp/rootfs read-only", s.Root)
	}
	if s.Process.Terminal || len(s.Process.Args) != 1 || s.Process.Args[0] != "true" {
		t.Errorf("process = %+v, want args [true] without terminal", s.Process)
	}
	var types []string
	for _, ns := range s.Linux.Namespaces {
		types = append(types, ns.Type)
	}
	if len(types) != 5 || types[4] != "network" {
		t.Errorf("namespaces = %v, want the four given plus network", types)
	}
	if s.OCIVersion != "1.0.2-dev" || len(s.Process.Env) != 1 || len(s.Linux.MaskedPaths) != 1 {
		t.Errorf("EditSpec dropped fields it does not own: %s", out)
	}
	// A spec that has the network namespace keeps exactly one.
	again, err := EditSpec(out, "/tmp/rootfs", []string{"true"})
	if err != nil {
		t.Fatal(err)
	}
	var s2 testSpec
	if err := json.Unmarshal(again, &s2); err != nil {
		t.Fatal(err)
	}
	if len(s2.Linux.Namespaces) != 5 {
		t.Errorf("second EditSpec: %d namespaces, want 5", len(s2.Linux.Namespaces))
	}
	if _, err := EditSpec([]byte(`{"linux":{}}`), "/r", []string{"true"}); err == nil {
		t.Error("EditSpec accepted a spec without a process")
	}
}

func TestParseMemAvailable(t *testing.T) {
	got, err := parseMemAvailable([]byte("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n"))
	if err != nil || got != 2048<<10 {
		t.Errorf("parseMemAvailable = %d, %v; want %d", got, err, 2048<<10)
	}
	if _, err := parseMemAvailable([]byte("MemTotal: 1 kB\n")); err == nil {
		t.Error("parseMemAvailable accepted meminfo without MemAvailable")
	}
}

func TestNamesSandbox(t *testing.T) {
	ids := []string{"n1-abc123", "n1-def456"}
	want := map[string]bool{ids[0]: true, ids[1]: true}
	for _, tc := range []struct {
		cg   string
		want bool
	}{
		{"12:memory:/corral/n1-abc123\n0::/corral/n1-abc123\n", true},
		{"4:cpu,cpuacct:/corral/sb-n1-def456.scope\n", true},
		{"12:memory:/user.slice\n0::/user.slice/session-1.scope\n", false},
		{"0::/\n", false},
	} {
		if got := namesSandbox([]byte(tc.cg), want, ids); got != tc.want {
			t.Errorf("namesSandbox(%q) = %v, want %v", tc.cg, got, tc.want)
		}
	}
	if got := memoryCgroupUsageFile([]byte("4:cpu:/x\n9:memory:/corral/n1-abc123\n")); got != "/sys/fs/cgroup/memory/corral/n1-abc123/memory.usage_in_bytes" {
		t.Errorf("memoryCgroupUsageFile = %q", got)
	}
}

func TestTargets(t *testing.T) {
	r := &ContainerResult{CreateReadyP50Ms: 9, CyclesPerS: 90, ExecP50Ms: 1.5, RuncReason: "runc not found"}
	ts := containerTargets(r)
	met := map[string]bool{}
	for _, tg := range ts {
		met[tg.Figure] = tg.Met
	}
	if !met["create_ready_p50_ms"] || met["cycles_per_s"] || !met["exec_p50_ms"] || met["ratio_vs_runc"] {
		t.Errorf("targets = %+v", ts)
	}
	if ts[3].Skipped != "runc not found" {
		t.Errorf("ratio target without runc: %+v, want skipped with the reason", ts[3])
	}
}

// TestAlternate checks that a figure and its peer take turns, a b then b a,
// in rounds of at least minRound, and that each one's rounds add up.
func TestAlternate(t *testing.T) {
	var order []string
	phaseOf := func(name string, perRound int) phase {
		return func(_ context.Context, d time.Duration, round int) Rate {
			order = append(order, fmt.Sprintf("%s%d:%v", name, round, d))
			return Rate{Cycles: perRound, Seconds: d.Seconds(), PerS: float64(perRound) / d.Seconds(), FirstErr: name}
		}
	}
	a, b := alternate(context.Background(), 4*minRound+time.Second, phaseOf("a", 10), phaseOf("b", 3))
	each := (4*minRound + time.Second) / 4
	want := []string{"a0:" + each.String(), "b0:" + each.String(), "b1:" + each.String(), "a1:" + each.String(),
		"a2:" + each.String(), "b2:" + each.String(), "b3:" + each.String(), "a3:" + each.String()}
	if !slices.Equal(order, want) {
		t.Errorf("rounds ran %v, want %v", order, want)
	}
	secs := round(4 * each.Seconds())
	if a.Cycles != 40 || a.Seconds != secs || a.PerS != round(40/secs) || a.FirstErr != "a" {
		t.Errorf("a's rounds add up to %+v, want 40 cycles in %v s", a, secs)
	}
	if b.Cycles != 12 || b.PerS != round(12/secs) {
		t.Errorf("b's rounds add up to %+v, want 12 cycles in %v s", b, secs)
	}

	var r Rate
	r.add(Rate{Cycles: 10, Seconds: 1, PerS: 10})
	r.add(Rate{Cycles: 60, Seconds: 3, PerS: 20})
	if r.Cycles != 70 || r.Seconds != 4 || r.PerS != 17.5 {
		t.Errorf("rounds of 10/s for 1 s and 20/s for 3 s add up to %+v, want 70 cycles in 4 s at 17.5/s", r)
	}

	order = nil
	alternate(context.Background(), minRound/2, phaseOf("a", 1), phaseOf("b", 1))
	if want := []string{"a0:" + (minRound / 2).String(), "b0:" + (minRound / 2).String()}; !slices.Equal(order, want) {
		t.Errorf("a duration shorter than a round ran %v, want one round each: %v", order, want)
	}
}

// TestSustainRate: workers of unequal cycles stop at unequal times after
// the deadline; the rate is theirs summed (1/0.09 + 1/0.01 ≈ 111/s), not
// the cycles over the wall time to the slow worker's end (12 in 0.18 s,
// 67/s).
func TestSustainRate(t *testing.T) {
	r := sustain(context.Background(), 2, 100*time.Millisecond, func(_ context.Context, worker, _ int) error {
		time.Sleep([]time.Duration{90 * time.Millisecond, 10 * time.Millisecond}[worker])
		return nil
	})
	if r.PerS < 85 || r.PerS > 125 || r.Cycles < 9 || r.Cycles > 12 {
		t.Fatalf("sustain of a 90 ms and a 10 ms worker for 100 ms: %+v, want about 111/s", r)
	}
	if r.Seconds < 0.17 {
		t.Errorf("the phase's wall time %v s: the slow worker's second cycle ends at 0.18 s", r.Seconds)
	}
}
