package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/procfs"
)

// DensityOptions configure Density. Zero fields take the defaults.
type DensityOptions struct {
	N           int    // idle sandboxes (default 100)
	Concurrency int    // default 8
	Image       string // default "busybox"
	MemoryBytes int64  // per-sandbox limit (default 64 MiB)
	// ExpectRefusals says N is past what the node admits: the run passes
	// when the creates beyond are refused with ResourceExhausted (and no
	// create fails otherwise) while every admitted sandbox answers.
	ExpectRefusals bool
	Log            io.Writer // progress lines; nil discards
}

func (o *DensityOptions) defaults() {
	ifNotPositive(&o.N, 100)
	ifNotPositive(&o.Concurrency, 8)
	ifZero(&o.Image, "busybox")
	ifNotPositive(&o.MemoryBytes, 64<<20)
	ifZero(&o.Log, io.Discard)
}

// DensityResult is the outcome of Density.
type DensityResult struct {
	N           int    `json:"n"`
	Image       string `json:"image"`
	MemoryBytes int64  `json:"memory_bytes"`
	Concurrency int    `json:"concurrency"`

	Created      int     `json:"created"`
	CreateErrors int     `json:"create_errors"`
	CreateS      float64 `json:"create_s"`
	CreatesPerS  float64 `json:"creates_per_s"`
	FirstErr     string  `json:"first_error,omitempty"`
	// Refused are the creates refused with ResourceExhausted (the node at
	// a host or quota limit); CreateErrors counts them too.
	Refused      int    `json:"refused"`
	FirstRefusal string `json:"first_refusal,omitempty"`

	// Host PIDs per idle sandbox: the threads of the sandboxes' processes
	// plus the kernel threads started meanwhile (children of kthreadd),
	// over Created. The host's whole task count before and with all idle
	// is reported beside it: on a shared host it also moves with others.
	HostTasksBefore       int64   `json:"host_tasks_before"`
	HostTasksIdle         int64   `json:"host_tasks_idle"`
	KernelThreadsBefore   int64   `json:"kernel_threads_before"`
	KernelThreadsIdle     int64   `json:"kernel_threads_idle"`
	HostPIDsPerSandbox    float64 `json:"host_pids_per_sandbox"`
	KernelPIDsPerSandbox  float64 `json:"kernel_pids_per_sandbox"`
	HostTasksDeltaPerSbox float64 `json:"host_tasks_delta_per_sandbox"`

	// Host memory: MemAvailable before creating, with all created, after deleting.
	MemAvailableBeforeMiB float64 `json:"mem_available_before_mib"`
	MemAvailableIdleMiB   float64 `json:"mem_available_idle_mib"`
	MemAvailableAfterMiB  float64 `json:"mem_available_after_mib"`
	HostMiBPerSandbox     float64 `json:"host_mib_per_sandbox"`
	// NotReturnedMiB is MemAvailable before minus after deleting everything.
	NotReturnedMiB float64 `json:"not_returned_mib"`

	// Processes found by their cgroup naming a sandbox id (nil: not found).
	Procs *ProcMemory `json:"procs,omitempty"`

	Answered  int         `json:"answered"`
	AllAnswer bool        `json:"all_answer"`
	Exec      Percentiles `json:"exec"` // `true` in each idle sandbox, under load

	Leaked  int      `json:"leaked"`
	Targets []Target `json:"targets"`
	Load    Load     `json:"load"`
}

// Density creates N idle sandboxes, measures what they cost the host, runs
// `true` in each, deletes them all and checks none is left.
func Density(ctx context.Context, c *client.Client, o DensityOptions) (res *DensityResult, err error) {
	o.defaults()
	t := newTracker(c)
	res = &DensityResult{N: o.N, Image: o.Image, MemoryBytes: o.MemoryBytes, Concurrency: o.Concurrency}
	defer func() { err = t.finish(ctx, &res.Load, &res.Leaked, err) }()
	res.Load.Start, res.Load.CPUs = loadAvg(), runtime.NumCPU()

	fmt.Fprintln(o.Log, "settling MemAvailable before")
	before, err := settledMemAvailable(ctx)
	if err != nil {
		return res, err
	}
	res.MemAvailableBeforeMiB = mib(before)
	res.HostTasksBefore, res.KernelThreadsBefore = hostTasks(), kernelThreads()

	fmt.Fprintf(o.Log, "creating %d sandboxes (%d at a time, memory %d MiB)\n", o.N, o.Concurrency, o.MemoryBytes>>20)
	sbs := make([]*client.Sandbox, o.N)
	var failed, refused atomic.Int64
	var once, onceRefused sync.Once
	start := time.Now()
	create := client.CreateOptions{Image: o.Image, Resources: client.Resources{MemoryBytes: o.MemoryBytes}}
	parallel(ctx, o.N, o.Concurrency, func(ctx context.Context, i int) {
		sb, err := t.create(ctx, create)
		if err != nil {
			failed.Add(1)
			if client.IsResourceExhausted(err) {
				refused.Add(1)
				onceRefused.Do(func() { res.FirstRefusal = err.Error() })
			} else {
				once.Do(func() { res.FirstErr = err.Error() })
			}
			return
		}
		sbs[i] = sb
		if done := i + 1; done%100 == 0 {
			fmt.Fprintf(o.Log, "  %d started\n", done)
		}
	})
	res.CreateS = round(time.Since(start).Seconds())
	live := sbs[:0:0]
	for _, sb := range sbs {
		if sb != nil {
			live = append(live, sb)
		}
	}
	res.Created, res.CreateErrors, res.Refused = len(live), int(failed.Load()), int(refused.Load())
	res.CreatesPerS = round(float64(res.Created) / res.CreateS)
	if ctx.Err() != nil {
		return res, ctx.Err()
	}

	fmt.Fprintln(o.Log, "settling MemAvailable with all idle")
	idle, err := settledMemAvailable(ctx)
	if err != nil {
		return res, err
	}
	res.MemAvailableIdleMiB = mib(idle)
	res.HostTasksIdle, res.KernelThreadsIdle = hostTasks(), kernelThreads()
	ids := make([]string, len(live))
	for i, sb := range live {
		ids[i] = sb.ID()
	}
	res.Procs = sandboxProcMemory(ids)
	if n := float64(res.Created); n > 0 {
		res.HostMiBPerSandbox = round(mib(before-idle) / n)
		res.HostTasksDeltaPerSbox = round(float64(res.HostTasksIdle-res.HostTasksBefore) / n)
		res.KernelPIDsPerSandbox = round(float64(res.KernelThreadsIdle-res.KernelThreadsBefore) / n)
		if res.Procs != nil {
			res.HostPIDsPerSandbox = round(float64(res.Procs.Threads)/n + res.KernelPIDsPerSandbox)
		}
	}

	fmt.Fprintf(o.Log, "running true in each of %d sandboxes\n", len(live))
	lat := make([]time.Duration, len(live))
	var answered atomic.Int64
	parallel(ctx, len(live), o.Concurrency, func(ctx context.Context, i int) {
		s := time.Now()
		if runTrue(ctx, live[i]) == nil {
			lat[i] = time.Since(s)
			answered.Add(1)
		}
	})
	res.Answered = int(answered.Load())
	res.AllAnswer = res.Answered == res.Created && (res.Created == o.N || o.ExpectRefusals)
	ok := lat[:0:0]
	for _, d := range lat {
		if d > 0 {
			ok = append(ok, d)
		}
	}
	res.Exec = Summarise(ok)

	fmt.Fprintf(o.Log, "deleting %d sandboxes\n", len(live))
	var delErrs atomic.Int64
	parallel(ctx, len(live), o.Concurrency, func(ctx context.Context, i int) {
		if t.delete(ctx, live[i]) != nil {
			delErrs.Add(1)
		}
	})
	left, err := t.remaining(ctx)
	if err != nil {
		return res, fmt.Errorf("list after delete: %w", err)
	}
	res.Leaked = len(left)
	if after, err := settledMemAvailable(ctx); err == nil {
		res.MemAvailableAfterMiB = mib(after)
		res.NotReturnedMiB = round(mib(before - after))
	}
	res.Targets = []Target{
		atMost("host_mib_per_sandbox", res.HostMiBPerSandbox, 3),
		atMost("host_pids_per_sandbox", res.HostPIDsPerSandbox, 4),
		atLeast("answered", float64(res.Answered), float64(o.N)),
		atMost("leaked", float64(res.Leaked), 0),
	}
	if o.ExpectRefusals {
		// Past the node's limit: every create either made a sandbox that
		// answers or was refused cleanly.
		res.Targets[2] = atLeast("answered", float64(res.Answered), float64(res.Created))
		res.Targets = append(res.Targets,
			atLeast("refused", float64(res.Refused), 1),
			atMost("other_create_errors", float64(res.CreateErrors-res.Refused), 0))
	}
	return res, ctx.Err()
}

func mib(b int64) float64 { return round(float64(b) / (1 << 20)) }

// kernelThreads counts the children of kthreadd (PID 2) but the pooled
// workqueue workers (kworker/N:N, kworker/uN:N), which the kernel starts
// and ends with its load: the kernel threads made for something, such as
// the rescuer of a mounted filesystem's workqueue.
func kernelThreads() int64 {
	var n int64
	for pid := range procfs.PIDs() {
		b, err := os.ReadFile(procfs.Path(pid, "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at the last ')'.
		open, end := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
		if open < 0 || end < open {
			continue
		}
		if f := strings.Fields(string(b[end+1:])); len(f) < 2 || f[1] != "2" || pooledWorker(string(b[open+1:end])) {
			continue
		}
		n++
	}
	return n
}

func pooledWorker(comm string) bool {
	rest, ok := strings.CutPrefix(comm, "kworker/")
	return ok && rest != "" && (rest[0] == 'u' || rest[0] >= '0' && rest[0] <= '9')
}

// hostTasks is the host's task count (the kernel's nr_threads, in
// /proc/loadavg): each holds a PID of the host, kernel threads included.
func hostTasks() int64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return -1
	}
	_, total, _ := strings.Cut(f[3], "/")
	n, _ := strconv.ParseInt(total, 10, 64)
	return n
}

// WriteTable prints the result as a table.
func (r *DensityResult) WriteTable(w io.Writer) error {
	rows := []row{
		{"created", fmt.Sprintf("%d of %d in %ss (%s/s, %d errors, %d of them refused: resource exhausted)", r.Created, r.N, f3(r.CreateS), f3(r.CreatesPerS), r.CreateErrors, r.Refused), "", targetFor(r.Targets, "refused")},
		{"host PIDs per idle sandbox", f3(r.HostPIDsPerSandbox),
			fmt.Sprintf("its processes' threads + %s kernel threads (kernel threads %d → %d); host tasks %d → %d (%s per sandbox, others' included)",
				f3(r.KernelPIDsPerSandbox), r.KernelThreadsBefore, r.KernelThreadsIdle, r.HostTasksBefore, r.HostTasksIdle, f3(r.HostTasksDeltaPerSbox)),
			targetFor(r.Targets, "host_pids_per_sandbox")},
		r.threadsRow(),
		{"host MiB per idle sandbox", f3(r.HostMiBPerSandbox) + " MiB",
			fmt.Sprintf("MemAvailable %s → %s MiB", f3(r.MemAvailableBeforeMiB), f3(r.MemAvailableIdleMiB)),
			targetFor(r.Targets, "host_mib_per_sandbox")},
		r.procRow("cgroup memory usage per sandbox", func(p *ProcMemory) float64 { return p.CgroupMiB }),
		r.procRow("PSS per sandbox", func(p *ProcMemory) float64 { return p.PSSMiB }),
		r.procRow("RSS per sandbox", func(p *ProcMemory) float64 { return p.RSSMiB }),
		{"answered true", fmt.Sprintf("%d of %d (all_answer %v)", r.Answered, r.N, r.AllAnswer), "", targetFor(r.Targets, "answered")},
		{"exec true under load p50/p99", f3(r.Exec.P50) + " / " + f3(r.Exec.P99) + " ms", "", ""},
		{"leaked after delete", fmt.Sprint(r.Leaked), "", targetFor(r.Targets, "leaked")},
		{"MiB not returned after delete", f3(r.NotReturnedMiB), fmt.Sprintf("MemAvailable after %s MiB", f3(r.MemAvailableAfterMiB)), ""},
	}
	title := fmt.Sprintf("corral bench density: %d idle sandboxes, image %s, memory limit %d MiB, %d at a time",
		r.N, r.Image, r.MemoryBytes>>20, r.Concurrency)
	if err := writeTable(w, title, rows); err != nil {
		return err
	}
	fmt.Fprintln(w, r.Load)
	if r.FirstRefusal != "" {
		fmt.Fprintf(w, "first refusal: %s\n", r.FirstRefusal)
	}
	if r.FirstErr != "" {
		fmt.Fprintf(w, "first create error (other than a refusal): %s\n", r.FirstErr)
	}
	return nil
}

// procRow shows one per-sandbox figure of the processes found in /proc.
func (r *DensityResult) procRow(name string, f func(*ProcMemory) float64) row {
	if r.Procs == nil {
		return row{name, "not found", "no process with a sandbox id in its cgroup path", ""}
	}
	return row{name, f3(f(r.Procs)/float64(max(1, r.Created))) + " MiB",
		fmt.Sprintf("%s MiB in %d processes, %d cgroups", f3(f(r.Procs)), r.Procs.Processes, r.Procs.Cgroups), ""}
}

// threadsRow shows the threads of the sandboxes' own processes per
// sandbox: the part of their host PIDs that is not a kernel thread.
func (r *DensityResult) threadsRow() row {
	if r.Procs == nil {
		return row{"threads in sandbox cgroups per sandbox", "not found", "", ""}
	}
	return row{"threads in sandbox cgroups per sandbox", f3(float64(r.Procs.Threads) / float64(max(1, r.Created))),
		fmt.Sprintf("%d threads in %d processes", r.Procs.Threads, r.Procs.Processes), ""}
}
