// Package bench measures corral against a live server, each figure beside a
// peer measured in the same run on the same machine (docs/ARCHITECTURE.md §1): runc for
// the container lifecycle, a plain fork/exec for exec latency, the host's
// MemAvailable for density. It drives the server only through the Go SDK
// (package client) and must not import the server's internal packages —
// except Lazy, which measures the node's lazy image path (storage/layers,
// storage/blob, storage/lazy, seaweed) directly on this host until
// sandboxes use it, the runc peer, whose rootfs takes the host's static
// busybox as storage/layers finds it, and Cluster, which runs its own etcd,
// simulated nodes and control plane (etcdembed, cluster, cluster/simnode,
// server) in this process.
package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Percentiles summarises a set of durations, in milliseconds.
type Percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

// Summarise computes nearest-rank p50, p99 and max of ds. It sorts a copy;
// an empty input gives zeros.
func Summarise(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return Percentiles{
		N:   len(s),
		P50: ms(Percentile(s, 50)),
		P99: ms(Percentile(s, 99)),
		Max: ms(s[len(s)-1]),
	}
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted, which must be sorted ascending and non-empty.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}

func ms(d time.Duration) float64 { return round(float64(d) / float64(time.Millisecond)) }

// round keeps three significant decimals, enough for sub-millisecond figures.
func round(f float64) float64 { return math.Round(f*1000) / 1000 }

// Target is one promise checked against a figure measured in the run.
type Target struct {
	Figure string  `json:"figure"`
	Op     string  `json:"op"` // "at_most" or "at_least"
	Limit  float64 `json:"limit"`
	Value  float64 `json:"value"`
	Met    bool    `json:"met"`
	// Skipped says why the figure could not be measured (Met is then false).
	Skipped string `json:"skipped,omitempty"`
}

func atMost(figure string, value, limit float64) Target {
	return Target{Figure: figure, Op: "at_most", Limit: limit, Value: value, Met: value <= limit}
}

func atLeast(figure string, value, limit float64) Target {
	return Target{Figure: figure, Op: "at_least", Limit: limit, Value: value, Met: value >= limit}
}

// row is one line of a printed table: figure, value, peer, target.
type row struct{ figure, value, peer, target string }

func writeTable(w io.Writer, title string, rows []row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, title)
	fmt.Fprintln(tw, "FIGURE\tVALUE\tPEER OR DETAIL (same run)\tTARGET")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.figure, r.value, orDash(r.peer), orDash(r.target))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// verdict renders a target as "<= 15 met" or ">= 100 NOT MET".
func verdict(t Target) string {
	op := map[string]string{"at_most": "<=", "at_least": ">="}[t.Op]
	if t.Skipped != "" {
		return fmt.Sprintf("%s %g not measured", op, t.Limit)
	}
	word := "met"
	if !t.Met {
		word = "NOT MET"
	}
	return fmt.Sprintf("%s %g %s", op, t.Limit, word)
}

func targetFor(ts []Target, figure string) string {
	for _, t := range ts {
		if t.Figure == figure {
			return verdict(t)
		}
	}
	return ""
}

func f3(f float64) string {
	s := fmt.Sprintf("%.3f", f)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

// ratio is a/b rounded for a table; 0 when b is not positive (no peer).
func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return round(a / b)
}
