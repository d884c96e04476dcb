package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/corral-dev/corral/client"
)

// Published figures the pause benchmark prints beside its own (not
// measured here: neither platform runs on this machine).
const (
	e2bPauseSPerGiB  = 4.0  // E2B: pause (snapshot) ~4 s per GiB of RAM
	e2bResumeMs      = 1000 // E2B: resume ~1 s
	agentEnvPauseMs  = 100  // AgentENV: pause < 100 ms
	agentEnvResumeMs = 50   // AgentENV: resume < 50 ms
)

// PauseOptions configure Pause. Zero fields take the defaults.
type PauseOptions struct {
	SizesMiB []int // memory touched per sandbox (default 64, 256, 1024)
	N        int   // freeze pause/resume samples per size (default 10)
	// ReclaimN is the reclaim samples per size (default 1): each pushes
	// the whole working set to disk, and the holder does not touch it
	// again, so a second sample would find nothing left to push.
	ReclaimN int
	// MicroVMN is the microVM snapshot/restore samples (default 3;
	// negative: not measured).
	MicroVMN int
	// ForkN is how many sandboxes the microVM fork makes (default 8).
	ForkN int
	// Job is the sandboxes of the job paused and resumed by label
	// (default 500; negative: not measured).
	Job int
	// Probe is the host path of the static corral-probe, whose workingset
	// mode holds the re-read working set ("": those rows not measured).
	Probe string
	Log   io.Writer
}

func (o *PauseOptions) defaults() {
	if len(o.SizesMiB) == 0 {
		o.SizesMiB = []int{64, 256, 1024}
	}
	ifNotPositive(&o.N, 10)
	ifNotPositive(&o.ReclaimN, 1)
	ifZero(&o.MicroVMN, 3)
	ifNotPositive(&o.ForkN, 8)
	ifZero(&o.Job, 500)
	ifZero(&o.Log, io.Discard)
}

// PauseLevel is one pause level's figures for one size.
type PauseLevel struct {
	// FreedPct is the share of the sandbox's resident memory the pause
	// took out of RAM (median over the samples).
	FreedPct float64     `json:"freed_pct"`
	Pause    Percentiles `json:"pause"`
	// ResumeExec is pause→(first exec returns): the exec resumes the
	// sandbox transparently.
	ResumeExec Percentiles `json:"resume_to_first_exec"`
	Skipped    string      `json:"skipped,omitempty"`
}

// PauseSize is the figures for one touched size.
type PauseSize struct {
	MiB         int         `json:"mib"`
	ResidentMiB float64     `json:"resident_mib"` // before the first pause
	Exec        Percentiles `json:"exec_running"` // peer: exec on the running sandbox
	Freeze      PauseLevel  `json:"freeze"`
	Reclaim     PauseLevel  `json:"reclaim"`
	// WorkingSet: time until the whole working set is in RAM again.
	WorkingSet WorkingSetFigures `json:"working_set"`
}

// ForkFigures time Fork × 8 of a container beside 8 plain creates.
type ForkFigures struct {
	N        int     `json:"n"`
	ForkMs   float64 `json:"fork_ms"`   // one Fork call making N sandboxes (pack included)
	CreateMs float64 `json:"create_ms"` // peer: N creates of busybox, as many at once
	Failed   int     `json:"failed"`
}

// PauseResult is the outcome of Pause.
type PauseResult struct {
	Sizes   []PauseSize            `json:"sizes"`
	Fork    ForkFigures            `json:"fork"`
	MicroVM MicroVMSnapshotFigures `json:"microvm"`
	Job     JobFigures             `json:"job"`
	Targets []Target               `json:"targets"`
	Load    Load                   `json:"load"`
	Leaked  int                    `json:"leaked"`
}

// Pause measures the pause levels of container sandboxes holding 64, 256
// and 1,024 MiB: memory freed, pause time and resume-to-first-exec for
// freeze and reclaim, beside an exec on the running sandbox (same run)
// and E2B's and AgentENV's published figures. Reclaim needs a server with
// a swap area (corral serve --swap); without one its rows say so.
func Pause(ctx context.Context, c *client.Client, o PauseOptions) (res *PauseResult, err error) {
	o.defaults()
	t := newTracker(c)
	res = &PauseResult{}
	defer func() { err = t.finish(ctx, &res.Load, &res.Leaked, err) }()
	res.Load.Start, res.Load.CPUs = loadAvg(), runtime.NumCPU()
	for _, mib := range o.SizesMiB {
		fmt.Fprintf(o.Log, "pause: %d MiB\n", mib)
		s, err := pauseSize(ctx, t, mib, o)
		if err != nil {
			return res, fmt.Errorf("%d MiB: %w", mib, err)
		}
		// After pauseSize deleted its sandbox, so that its swapped pages are gone.
		if s.WorkingSet, err = workingSet(ctx, t, mib, o.Probe, o); err != nil {
			return res, fmt.Errorf("%d MiB working set: %w", mib, err)
		}
		res.Sizes = append(res.Sizes, s)
		res.Targets = append(res.Targets, atMost(fmt.Sprintf("resume_to_first_exec_p50_ms_%dmib_freeze", mib), s.Freeze.ResumeExec.P50, 5))
		if s.Reclaim.Skipped == "" {
			res.Targets = append(res.Targets,
				atLeast(fmt.Sprintf("reclaim_freed_pct_%dmib", mib), s.Reclaim.FreedPct, 95),
				atMost(fmt.Sprintf("resume_to_first_exec_p50_ms_%dmib_reclaim", mib), s.Reclaim.ResumeExec.P50, 5))
		}
	}
	fmt.Fprintln(o.Log, "pause: fork × 8")
	if res.Fork, err = forkFigures(ctx, t, 8); err != nil {
		return res, fmt.Errorf("fork: %w", err)
	}
	if o.MicroVMN > 0 {
		fmt.Fprintf(o.Log, "pause: microVM snapshot, restore, fork × %d\n", o.ForkN)
		if res.MicroVM, err = microVMSnapshots(ctx, t, o.MicroVMN, o.ForkN); err != nil {
			return res, fmt.Errorf("microVM snapshots: %w", err)
		}
	} else {
		res.MicroVM.Skipped = "not asked (--microvm-n)"
	}
	if o.Job < 0 {
		res.Job.Skipped = "--job 0"
		return res, nil
	}
	fmt.Fprintf(o.Log, "pause: a job of %d by label\n", o.Job)
	if res.Job, err = jobFigures(ctx, t, o.Job); err != nil {
		return res, fmt.Errorf("job: %w", err)
	}
	return res, nil
}

// forkFigures forks a sandbox holding a 16 MiB file n times, and times n
// plain creates (as many at once) as the peer.
func forkFigures(ctx context.Context, t *tracker, n int) (ForkFigures, error) {
	f := ForkFigures{N: n}
	sb, err := t.create(ctx, client.CreateOptions{Image: "busybox"})
	if err != nil {
		return f, err
	}
	defer t.delete(context.WithoutCancel(ctx), sb)
	if _, err := sb.Run(ctx, client.Command{Shell: "mkdir -p /work && head -c 16m /dev/urandom > /work/state"}); err != nil {
		return f, err
	}
	start := time.Now()
	res, err := sb.Fork(ctx, n)
	if err != nil {
		return f, err
	}
	f.ForkMs = ms(time.Since(start))
	f.Failed += t.deleteForks(ctx, res.Forks)
	start = time.Now()
	made := make([]*client.Sandbox, n)
	parallel(ctx, n, n, func(ctx context.Context, i int) {
		made[i], _ = t.create(ctx, client.CreateOptions{Image: "busybox"})
	})
	f.CreateMs = ms(time.Since(start))
	for _, m := range made {
		if m != nil {
			_ = t.delete(context.WithoutCancel(ctx), m)
		}
	}
	return f, nil
}

func pauseSize(ctx context.Context, t *tracker, mib int, o PauseOptions) (PauseSize, error) {
	s := PauseSize{MiB: mib}
	sb, err := t.create(ctx, client.CreateOptions{Image: "busybox", Resources: client.Resources{MemoryBytes: int64(mib+256) << 20}})
	if err != nil {
		return s, err
	}
	defer t.delete(context.WithoutCancel(ctx), sb)
	// dd fills its buffer from /dev/zero (touching every page), then blocks
	// writing to a pipe sleep never reads: the memory stays held.
	hold := fmt.Sprintf("dd if=/dev/zero bs=%dM count=2 2>/dev/null | sleep 1000000 >/dev/null 2>&1 &", mib)
	if _, err := sb.Run(ctx, client.Command{Shell: hold}); err != nil {
		return s, err
	}
	resident, err := waitResident(ctx, sb, int64(mib)<<20*95/100)
	if err != nil {
		return s, err
	}
	s.ResidentMiB = round(float64(resident) / (1 << 20))
	var execs []time.Duration
	for range o.N {
		start := time.Now()
		if _, err := sb.Run(ctx, client.Command{Args: []string{"true"}}); err != nil {
			return s, err
		}
		execs = append(execs, time.Since(start))
	}
	s.Exec = Summarise(execs)
	if s.Freeze, err = pauseLevel(ctx, sb, o.N, resident, sb.Pause); err != nil {
		return s, err
	}
	reclaim := func(ctx context.Context) error { _, err := sb.Reclaim(ctx); return err }
	s.Reclaim, err = pauseLevel(ctx, sb, o.ReclaimN, resident, reclaim)
	if client.IsFailedPrecondition(err) {
		s.Reclaim = PauseLevel{Skipped: err.Error()}
		err = nil
	}
	return s, err
}

// pauseLevel pauses n times with pause, reading the memory left in RAM,
// then times the exec that resumes the sandbox.
func pauseLevel(ctx context.Context, sb *client.Sandbox, n int, resident int64, pause func(context.Context) error) (PauseLevel, error) {
	var l PauseLevel
	var pauses, resumes []time.Duration
	var freed []float64
	for range n {
		start := time.Now()
		if err := pause(ctx); err != nil {
			return l, err
		}
		pauses = append(pauses, time.Since(start))
		info, err := sb.Info(ctx)
		if err != nil {
			return l, err
		}
		if info.Memory != nil {
			freed = append(freed, 100*(1-float64(info.Memory.ResidentBytes)/float64(resident)))
		}
		start = time.Now()
		if _, err := sb.Run(ctx, client.Command{Args: []string{"true"}}); err != nil {
			return l, err
		}
		resumes = append(resumes, time.Since(start))
	}
	l.Pause, l.ResumeExec = Summarise(pauses), Summarise(resumes)
	if len(freed) > 0 {
		l.FreedPct = round(median(freed))
	}
	return l, nil
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	for i := range s { // insertion sort: a handful of samples
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s[len(s)/2]
}

// waitResident waits until the sandbox holds at least want bytes in RAM.
func waitResident(ctx context.Context, sb *client.Sandbox, want int64) (int64, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		info, err := sb.Info(ctx)
		if err != nil {
			return 0, err
		}
		if info.Memory == nil {
			return 0, fmt.Errorf("the server reports no memory figures for sandbox %s", sb.ID())
		}
		if info.Memory.ResidentBytes >= want {
			return info.Memory.ResidentBytes, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("sandbox %s holds %d bytes after 2 minutes, want %d", sb.ID(), info.Memory.ResidentBytes, want)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WriteTable prints the result as a table.
func (r *PauseResult) WriteTable(w io.Writer) error {
	var rows []row
	for _, s := range r.Sizes {
		gib := float64(s.MiB) / 1024
		rows = append(rows,
			row{fmt.Sprintf("%d MiB: resident before", s.MiB), f3(s.ResidentMiB) + " MiB", "exec on the running sandbox p50 " + f3(s.Exec.P50) + " ms", ""},
			row{fmt.Sprintf("%d MiB freeze: freed / pause p50", s.MiB), fmt.Sprintf("%s%% / %s ms", f3(s.Freeze.FreedPct), f3(s.Freeze.Pause.P50)),
				fmt.Sprintf("AgentENV < %d ms, E2B ~%s ms (published)", agentEnvPauseMs, f3(e2bPauseSPerGiB*gib*1000)), ""},
			row{fmt.Sprintf("%d MiB freeze: resume→first exec p50", s.MiB), f3(s.Freeze.ResumeExec.P50) + " ms",
				fmt.Sprintf("%.1fx a running exec; AgentENV < %d ms, E2B ~%d ms (published)", ratio(s.Freeze.ResumeExec.P50, s.Exec.P50), agentEnvResumeMs, e2bResumeMs),
				targetFor(r.Targets, fmt.Sprintf("resume_to_first_exec_p50_ms_%dmib_freeze", s.MiB))},
		)
		if s.Reclaim.Skipped != "" {
			rows = append(rows, row{fmt.Sprintf("%d MiB reclaim", s.MiB), "not measured", s.Reclaim.Skipped, ""})
			rows = append(rows, s.WorkingSet.rows(s.MiB)...)
			continue
		}
		rows = append(rows,
			row{fmt.Sprintf("%d MiB reclaim: freed / pause p50", s.MiB), fmt.Sprintf("%s%% / %s ms", f3(s.Reclaim.FreedPct), f3(s.Reclaim.Pause.P50)),
				fmt.Sprintf("%.1fx freeze; E2B ~%s ms (published)", ratio(s.Reclaim.Pause.P50, s.Freeze.Pause.P50), f3(e2bPauseSPerGiB*gib*1000)),
				targetFor(r.Targets, fmt.Sprintf("reclaim_freed_pct_%dmib", s.MiB))},
			row{fmt.Sprintf("%d MiB reclaim: resume→first exec p50", s.MiB), f3(s.Reclaim.ResumeExec.P50) + " ms",
				fmt.Sprintf("%.1fx a running exec; AgentENV < %d ms, E2B ~%d ms (published)", ratio(s.Reclaim.ResumeExec.P50, s.Exec.P50), agentEnvResumeMs, e2bResumeMs),
				targetFor(r.Targets, fmt.Sprintf("resume_to_first_exec_p50_ms_%dmib_reclaim", s.MiB))},
		)
		rows = append(rows, s.WorkingSet.rows(s.MiB)...)
	}
	rows = append(rows, row{fmt.Sprintf("fork × %d (16 MiB of files, processes not carried)", r.Fork.N), f3(r.Fork.ForkMs) + " ms",
		fmt.Sprintf("%d plain creates at once %s ms (%.1fx); %d failed", r.Fork.N, f3(r.Fork.CreateMs), ratio(r.Fork.ForkMs, r.Fork.CreateMs), r.Fork.Failed), ""})
	rows = append(rows, r.MicroVM.rows()...)
	rows = append(rows, r.Job.rows()...)
	if err := writeTable(w, "corral bench pause: container sandboxes (busybox) holding N MiB", rows); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, r.Load)
	return err
}
