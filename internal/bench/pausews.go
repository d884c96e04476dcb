package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/client"
)

// WorkingSetFigures time how long a sandbox's whole working set takes to
// be in RAM again after each pause level: a process holding N MiB
// (corral-probe workingset) is asked to read one word of each of its pages
// by the exec that resumes the sandbox, and the exec returns once it has.
// The peer is the same request on the running sandbox.
type WorkingSetFigures struct {
	// Running is the request on the running sandbox (every page in RAM).
	Running Percentiles `json:"running"`
	// Freeze and Reclaim are pause→(every page read again), measured
	// from the start of the exec that resumes the sandbox.
	Freeze  Percentiles `json:"freeze"`
	Reclaim Percentiles `json:"reclaim"`
	// ReclaimTouch is the part of Reclaim the process spent reading its
	// pages (bringing them back from swap), by its own clock.
	ReclaimTouch   Percentiles `json:"reclaim_touch"`
	ReclaimFreed   float64     `json:"reclaim_freed_pct"`
	Skipped        string      `json:"skipped,omitempty"`
	ReclaimSkipped string      `json:"reclaim_skipped,omitempty"`
}

// wsDir is where the working set's FIFOs live in the sandbox.
const wsDir = "/tmp/corral-ws"

// workingSet measures WorkingSetFigures for mib MiB in a sandbox of its
// own; probe is the host path of corral-probe ("": not measured).
func workingSet(ctx context.Context, t *tracker, mib int, probe string, o PauseOptions) (WorkingSetFigures, error) {
	var f WorkingSetFigures
	if probe == "" {
		f.Skipped = "no corral-probe to hold the working set (--probe)"
		return f, nil
	}
	bin, err := os.ReadFile(probe)
	if err != nil {
		f.Skipped = fmt.Sprintf("corral-probe unreadable: %v", err)
		return f, nil
	}
	sb, err := t.create(ctx, client.CreateOptions{Image: "busybox", Resources: client.Resources{MemoryBytes: int64(mib+256) << 20}})
	if err != nil {
		return f, err
	}
	defer t.delete(context.WithoutCancel(ctx), sb)
	if _, err := sb.Files().WriteFrom(ctx, "/tmp/corral-probe", bytes.NewReader(bin), 0o755); err != nil {
		return f, fmt.Errorf("copy corral-probe: %w", err)
	}
	start := fmt.Sprintf("mkdir -p %s && /tmp/corral-probe workingset %d %s >/dev/null 2>%s/err &", wsDir, mib, wsDir, wsDir)
	if _, err := sb.Run(ctx, client.Command{Shell: start}); err != nil {
		return f, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r, err := sb.Run(ctx, client.Command{Shell: "test -e " + wsDir + "/ready || { cat " + wsDir + "/err; exit 1; }"})
		if err != nil {
			return f, err
		}
		if r.ExitCode == 0 {
			break
		}
		if time.Now().After(deadline) {
			return f, fmt.Errorf("the working set of %d MiB was not ready after 2 minutes: %s", mib, r.Stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	resident, err := waitResident(ctx, sb, int64(mib)<<20*95/100)
	if err != nil {
		return f, err
	}
	var running []time.Duration
	for range o.N {
		took, _, err := touchAll(ctx, sb)
		if err != nil {
			return f, err
		}
		running = append(running, took)
	}
	f.Running = Summarise(running)
	var freeze []time.Duration
	for range o.N {
		if err := sb.Pause(ctx); err != nil {
			return f, err
		}
		took, _, err := touchAll(ctx, sb)
		if err != nil {
			return f, err
		}
		freeze = append(freeze, took)
	}
	f.Freeze = Summarise(freeze)
	var back, touch []time.Duration
	var freed []float64
	for range o.ReclaimN {
		if _, err := sb.Reclaim(ctx); err != nil {
			if client.IsFailedPrecondition(err) {
				f.ReclaimSkipped = err.Error()
				return f, nil
			}
			return f, err
		}
		info, err := sb.Info(ctx)
		if err != nil {
			return f, err
		}
		if info.Memory != nil {
			freed = append(freed, 100*(1-float64(info.Memory.ResidentBytes)/float64(resident)))
		}
		took, inner, err := touchAll(ctx, sb)
		if err != nil {
			return f, err
		}
		back, touch = append(back, took), append(touch, inner)
	}
	f.Reclaim, f.ReclaimTouch = Summarise(back), Summarise(touch)
	if len(freed) > 0 {
		f.ReclaimFreed = round(median(freed))
	}
	return f, nil
}

// touchAll asks the working set to read every page and returns how long
// the exec took (a paused sandbox is resumed by it) and how long the
// process itself spent reading.
func touchAll(ctx context.Context, sb *client.Sandbox) (time.Duration, time.Duration, error) {
	start := time.Now()
	r, err := sb.Run(ctx, client.Command{Shell: "echo go > " + wsDir + "/in && cat " + wsDir + "/out", Timeout: 5 * time.Minute})
	took := time.Since(start)
	if err != nil {
		return 0, 0, err
	}
	fields := strings.Fields(string(r.Stdout))
	if r.ExitCode != 0 || len(fields) == 0 {
		return 0, 0, fmt.Errorf("working set: exit %d, output %q %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	ns, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("working set: output %q: %w", r.Stdout, err)
	}
	return took, time.Duration(ns), nil
}

// rows are the working set's lines of the pause table for mib MiB.
func (f WorkingSetFigures) rows(mib int) []row {
	name := fmt.Sprintf("%d MiB working set back", mib)
	if f.Skipped != "" {
		return []row{{name, "not measured", f.Skipped, ""}}
	}
	out := []row{{name + " after freeze p50", f3(f.Freeze.P50) + " ms",
		fmt.Sprintf("%.1fx reading it on the running sandbox (%s ms)", ratio(f.Freeze.P50, f.Running.P50), f3(f.Running.P50)), ""}}
	if f.ReclaimSkipped != "" {
		return append(out, row{name + " after reclaim", "not measured", f.ReclaimSkipped, ""})
	}
	return append(out, row{name + " after reclaim p50", f3(f.Reclaim.P50) + " ms",
		fmt.Sprintf("%.1fx on the running sandbox; %s%% had been freed, %s ms of it paging back in; E2B resume ~%d ms (published)",
			ratio(f.Reclaim.P50, f.Running.P50), f3(f.ReclaimFreed), f3(f.ReclaimTouch.P50), e2bResumeMs), ""})
}
