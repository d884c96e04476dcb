// Package redteam is corral's red-team suite: its tests run the probe
// (cmd/corral-probe) inside sandboxes of every backend the machine has,
// check the host side of each sandbox, and drive the resource and noisy-
// neighbour attacks of docs/THREATS.md; `make redteam` runs them and prints a
// table attempt × backend → blocked / expected / GAP / FAILED.
//
// This file holds the expected-outcome table (testdata/expected.json: one
// column per backend, "*" for what every backend must do) and the
// comparison; it is plain Go, testable without a server. The package is
// test-only in spirit: nothing outside it imports it, and it imports nothing
// from corral; its tests import the SDK, internal/testenv, internal/server
// (the servers they start), runtime/cgroup, netpolicy and netpolicy/netlab
// (the host and network attacks).
package redteam

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/corral-dev/corral/internal/probeproto"
)

// Result is one attempt's outcome, as the probe prints it (one JSON line)
// or as a test computes it. Outcome is "blocked" or "succeeded" for an
// attempt, "ok" or "violated" for a check the suite makes itself.
type Result = probeproto.Result

// Expect is what one backend must show for one attempt.
type Expect struct {
	Outcome string   `json:"outcome,omitempty"`
	Errnos  []string `json:"errnos,omitempty"` // any of these; empty: errno not checked
	// KnownGap names the runtime hardening that is missing: a mismatch
	// prints as GAP instead of failing, and a match fails (remove the gap).
	KnownGap string `json:"known_gap,omitempty"`
	// Skip says why the attempt does not apply to this backend.
	Skip string `json:"skip,omitempty"`
	// Why explains, for review, an outcome that differs from "*" by
	// design (a microVM's guest root may mount inside its own kernel).
	Why string `json:"why,omitempty"`
}

// Attempt is one row of the table.
type Attempt struct {
	Name   string            `json:"name"`
	Threat string            `json:"threat"`
	Expect map[string]Expect `json:"expect"` // backend or "*" → expectation
}

// Table is testdata/expected.json.
type Table struct {
	Backends []string  `json:"backends"`
	Attempts []Attempt `json:"attempts"`
}

// LoadTable reads and checks the expected table.
func LoadTable(path string) (*Table, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var t Table
	if err := json.Unmarshal(data, &t); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	seen := map[string]bool{}
	for _, a := range t.Attempts {
		if seen[a.Name] {
			return nil, fmt.Errorf("%s: attempt %q listed twice", path, a.Name)
		}
		seen[a.Name] = true
		for _, b := range t.Backends {
			if e := a.For(b); e.Outcome == "" && e.Skip == "" {
				return nil, fmt.Errorf("%s: attempt %q has no outcome for backend %s", path, a.Name, b)
			}
		}
	}
	return &t, nil
}

// For merges the backend's column over "*".
func (a Attempt) For(backend string) Expect {
	e := a.Expect["*"]
	o, ok := a.Expect[backend]
	if !ok {
		return e
	}
	if o.Outcome != "" {
		e.Outcome, e.Errnos = o.Outcome, o.Errnos
	} else if o.Errnos != nil {
		e.Errnos = o.Errnos
	}
	e.KnownGap, e.Skip = o.KnownGap, o.Skip
	return e
}

// Lookup returns the attempt called name.
func (t *Table) Lookup(name string) (Attempt, bool) {
	for _, a := range t.Attempts {
		if a.Name == name {
			return a, true
		}
	}
	return Attempt{}, false
}

// Statuses printed in the table.
const (
	StatusBlocked  = "blocked"
	StatusExpected = "expected"
	StatusGap      = "GAP"
	StatusFailed   = "FAILED"
	StatusSkipped  = "n/a"
)

// Verdict is the judgement on every result of one attempt on one backend.
type Verdict struct {
	Status string
	Why    string // the mismatching results, for FAILED and GAP
}

// Judge compares all results of one attempt (a name may be reported
// several times, e.g. once per socket tried) with the expectation.
func Judge(e Expect, results []Result) Verdict {
	if e.Skip != "" {
		return Verdict{Status: StatusSkipped, Why: e.Skip}
	}
	if len(results) == 0 {
		return Verdict{Status: StatusFailed, Why: "no result reported"}
	}
	var bad []string
	for _, r := range results {
		if r.Outcome != e.Outcome || (len(e.Errnos) > 0 && !slices.Contains(e.Errnos, r.Errno)) {
			bad = append(bad, fmt.Sprintf("got %s %s (%s), want %s %v", r.Outcome, r.Errno, r.Detail, e.Outcome, e.Errnos))
		}
	}
	switch {
	case len(bad) > 0 && e.KnownGap != "":
		return Verdict{Status: StatusGap, Why: e.KnownGap + ": " + strings.Join(bad, "; ")}
	case len(bad) > 0:
		return Verdict{Status: StatusFailed, Why: strings.Join(bad, "; ")}
	case e.KnownGap != "":
		return Verdict{Status: StatusFailed, Why: "known_gap " + e.KnownGap + " no longer shows: remove it from expected.json"}
	case e.Outcome == "blocked":
		return Verdict{Status: StatusBlocked}
	}
	return Verdict{Status: StatusExpected}
}

// Report collects verdicts for the printed table; safe for concurrent use.
type Report struct {
	mu       sync.Mutex
	verdicts map[string]map[string]Verdict // attempt → backend → verdict
	notes    map[string]string             // backend → why it did not run
	Lines    []string                      // free-form lines printed after the table
}

// NewReport returns an empty report.
func NewReport() *Report {
	return &Report{verdicts: map[string]map[string]Verdict{}, notes: map[string]string{}}
}

// Add records a verdict.
func (r *Report) Add(attempt, backend string, v Verdict) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.verdicts[attempt] == nil {
		r.verdicts[attempt] = map[string]Verdict{}
	}
	r.verdicts[attempt][backend] = v
}

// Unavailable records why a backend's column is empty.
func (r *Report) Unavailable(backend, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes[backend] = why
}

// Logf adds a line printed after the table.
func (r *Report) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Lines = append(r.Lines, fmt.Sprintf(format, args...))
}

// Format renders the table in the order of t, then attempts t lacks.
func (r *Report) Format(t *Table) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := []string{}
	listed := map[string]bool{}
	for _, a := range t.Attempts {
		names = append(names, a.Name)
		listed[a.Name] = true
	}
	var extra []string
	for n := range r.verdicts {
		if !listed[n] {
			extra = append(extra, n)
		}
	}
	sort.Strings(extra)
	names = append(names, extra...)
	var b strings.Builder
	fmt.Fprintf(&b, "%-58s", "attempt")
	for _, be := range t.Backends {
		fmt.Fprintf(&b, " %-10s", be)
	}
	b.WriteString("\n")
	var why []string
	for _, n := range names {
		fmt.Fprintf(&b, "%-58s", n)
		for _, be := range t.Backends {
			v, ok := r.verdicts[n][be]
			cell := "-"
			if ok {
				cell = v.Status
				if v.Why != "" && v.Status != StatusSkipped {
					why = append(why, fmt.Sprintf("%s %s [%s]: %s", v.Status, n, be, v.Why))
				}
			}
			fmt.Fprintf(&b, " %-10s", cell)
		}
		b.WriteString("\n")
	}
	for _, be := range t.Backends {
		if note, ok := r.notes[be]; ok {
			fmt.Fprintf(&b, "backend %s not run: %s\n", be, note)
		}
	}
	for _, w := range why {
		b.WriteString(w + "\n")
	}
	for _, l := range r.Lines {
		b.WriteString(l + "\n")
	}
	return b.String()
}
