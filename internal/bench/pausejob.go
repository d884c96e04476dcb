package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/client"
)

// JobFigures time a whole job of N sandboxes paused and resumed by its
// label (PauseMany, ResumeMany) beside the same done one sandbox at a
// time from the client, jobParallel calls at once (the peer).
type JobFigures struct {
	N            int     `json:"n"`
	CreateS      float64 `json:"create_s"` // making the job, jobParallel at once
	PauseManyMs  float64 `json:"pause_many_ms"`
	ResumeManyMs float64 `json:"resume_many_ms"`
	PauseEachMs  float64 `json:"pause_each_ms"`
	ResumeEachMs float64 `json:"resume_each_ms"`
	// Failed counts sandboxes a call by label did not pause or resume.
	Failed  int    `json:"failed"`
	Skipped string `json:"skipped,omitempty"`
}

// jobParallel is how many creates and single pauses the client keeps in
// flight (the node's own bulk calls run 16 at once).
const jobParallel = 16

// jobFigures makes n busybox sandboxes with a label of their own, pauses
// and resumes them by the label, then one by one, checking every time
// that all n changed state, and deletes them.
func jobFigures(ctx context.Context, t *tracker, n int) (JobFigures, error) {
	f := JobFigures{N: n}
	job := map[string]string{"job": "bench-" + t.label}
	made := make([]*client.Sandbox, n)
	var failed atomic.Int32
	start := time.Now()
	parallel(ctx, n, jobParallel, func(ctx context.Context, i int) {
		sb, err := t.create(ctx, client.CreateOptions{Image: "busybox", Labels: job, Resources: client.Resources{MemoryBytes: 32 << 20}})
		if err != nil {
			failed.Add(1)
			return
		}
		made[i] = sb
	})
	f.CreateS = round(time.Since(start).Seconds())
	defer func() {
		ids := make([]string, 0, n)
		for _, sb := range made {
			if sb != nil {
				ids = append(ids, sb.ID())
			}
		}
		_ = t.deleteAll(context.WithoutCancel(ctx), ids)
	}()
	if k := failed.Load(); k > 0 {
		return f, fmt.Errorf("job of %d: %d creates failed", n, k)
	}
	bulk := func(op func() (*client.BulkResult, error)) (float64, error) {
		start := time.Now()
		r, err := op()
		if err != nil {
			return 0, err
		}
		f.Failed += n - r.Done
		return ms(time.Since(start)), nil
	}
	var err error
	if f.PauseManyMs, err = bulk(func() (*client.BulkResult, error) { return t.c.PauseMany(ctx, job, false) }); err != nil {
		return f, fmt.Errorf("pause many: %w", err)
	}
	if f.ResumeManyMs, err = bulk(func() (*client.BulkResult, error) { return t.c.ResumeMany(ctx, job) }); err != nil {
		return f, fmt.Errorf("resume many: %w", err)
	}
	each := func(op func(*client.Sandbox, context.Context) error) (float64, error) {
		var errs atomic.Int32
		start := time.Now()
		parallel(ctx, n, jobParallel, func(ctx context.Context, i int) {
			if op(made[i], ctx) != nil {
				errs.Add(1)
			}
		})
		if k := errs.Load(); k > 0 {
			return 0, fmt.Errorf("%d of %d failed", k, n)
		}
		return ms(time.Since(start)), nil
	}
	if f.PauseEachMs, err = each((*client.Sandbox).Pause); err != nil {
		return f, fmt.Errorf("pause each: %w", err)
	}
	if f.ResumeEachMs, err = each((*client.Sandbox).Resume); err != nil {
		return f, fmt.Errorf("resume each: %w", err)
	}
	return f, nil
}

func (f JobFigures) rows() []row {
	if f.Skipped != "" {
		return []row{{"job by label", "not measured", f.Skipped, ""}}
	}
	return []row{
		{fmt.Sprintf("job of %d: PauseMany by label", f.N), f3(f.PauseManyMs) + " ms",
			fmt.Sprintf("%d Pause calls, %d at once: %s ms (%.2fx); %d not paused or resumed", f.N, jobParallel, f3(f.PauseEachMs), ratio(f.PauseManyMs, f.PauseEachMs), f.Failed), ""},
		{fmt.Sprintf("job of %d: ResumeMany by label", f.N), f3(f.ResumeManyMs) + " ms",
			fmt.Sprintf("%d Resume calls, %d at once: %s ms (%.2fx); the job took %s s to create", f.N, jobParallel, f3(f.ResumeEachMs), ratio(f.ResumeManyMs, f.ResumeEachMs), f3(f.CreateS)), ""},
	}
}
