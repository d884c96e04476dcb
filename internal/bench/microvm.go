package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/procfs"
)

// MicroVMOptions configure MicroVM. Zero fields take the defaults.
type MicroVMOptions struct {
	Image       string        // default "busybox"
	Boots       int           // create→first exec samples per backend (default 5)
	Execs       int           // exec samples per backend (default 30)
	Idle        int           // idle sandboxes for the memory figure (default 20)
	MemoryBytes int64         // guest RAM of each microVM (default 256 MiB)
	SnapshotMax time.Duration // longest wait for a paused VM's snapshot (default 3m)
	Log         io.Writer
}

func (o *MicroVMOptions) defaults() {
	ifZero(&o.Image, "busybox")
	ifNotPositive(&o.Boots, 5)
	ifNotPositive(&o.Execs, 30)
	ifNotPositive(&o.Idle, 20)
	ifNotPositive(&o.MemoryBytes, 256<<20)
	ifNotPositive(&o.SnapshotMax, 3*time.Minute)
	ifZero(&o.Log, io.Discard)
}

// MicroVMResult compares the microvm backend with containers from the same
// run. Host figures (KVM, RSS, files) are read from the VMM processes on
// this host, so run it on the server's machine.
type MicroVMResult struct {
	Image string `json:"image"`
	KVM   bool   `json:"kvm"`
	VMM   string `json:"vmm"`

	BootReadyP50Ms       float64     `json:"boot_ready_p50_ms"`
	BootReady            Percentiles `json:"boot_ready"`
	ContainerReadyP50Ms  float64     `json:"container_ready_p50_ms"`
	RatioBootVsContainer float64     `json:"ratio_boot_vs_container"`

	ExecP50Ms            float64 `json:"exec_p50_ms"`
	ContainerExecP50Ms   float64 `json:"container_exec_p50_ms"`
	RatioExecVsContainer float64 `json:"ratio_exec_vs_container"`

	IdleVMs             int     `json:"idle_vms"`
	HostMiBPerVM        float64 `json:"host_mib_per_vm"` // VMM RSS + run dir blocks
	VMMRSSMiBPerVM      float64 `json:"vmm_rss_mib_per_vm"`
	FilesMiBPerVM       float64 `json:"files_mib_per_vm"`
	GuestRAMMiB         int64   `json:"guest_ram_mib"`
	MemAvailMiBPerVM    float64 `json:"memavailable_mib_per_vm"`
	ContainerMiBPerIdle float64 `json:"container_memavailable_mib_per_sandbox"`

	Snapshotted       bool    `json:"snapshotted"`
	SnapshotMiB       float64 `json:"snapshot_mib"`
	ResumeMs          float64 `json:"resume_ms"`
	ResumeReadyMs     float64 `json:"resume_ready_ms"` // resume + first exec
	ContainerResumeMs float64 `json:"container_resume_ms"`
	PausedVMMRSSMiB   float64 `json:"paused_vmm_rss_mib"`
	Load              Load    `json:"load"`
	Leaked            int     `json:"leaked"`
}

// MicroVM measures boot→ready, exec latency, idle host memory and resume
// from a memory snapshot of microVMs, each beside a container sandbox.
func MicroVM(ctx context.Context, c *client.Client, o MicroVMOptions) (res *MicroVMResult, err error) {
	o.defaults()
	t := newTracker(c)
	res = &MicroVMResult{Image: o.Image, IdleVMs: o.Idle, GuestRAMMiB: o.MemoryBytes >> 20}
	defer func() { err = t.finish(ctx, &res.Load, &res.Leaked, err) }()
	res.Load.Start, res.Load.CPUs = loadAvg(), runtime.NumCPU()
	vmOpts := client.CreateOptions{Backend: "microvm", Image: o.Image, Resources: client.Resources{MemoryBytes: o.MemoryBytes, CPUMillis: 1000}}
	ctrOpts := client.CreateOptions{Image: o.Image, Resources: client.Resources{MemoryBytes: o.MemoryBytes}}

	fmt.Fprintf(o.Log, "create→first exec: %d microVMs, %d containers\n", o.Boots, o.Boots)
	vmReady, err := readySamples(ctx, t, vmOpts, o.Boots, func(sb *client.Sandbox) {
		if v := findVMM(sb.ID()); v != nil {
			res.KVM, res.VMM = v.kvm, v.name
		}
	})
	if err != nil {
		return res, err
	}
	ctrReady, err := readySamples(ctx, t, ctrOpts, o.Boots, nil)
	if err != nil {
		return res, err
	}
	res.BootReady = Summarise(vmReady)
	res.BootReadyP50Ms = res.BootReady.P50
	res.ContainerReadyP50Ms = Summarise(ctrReady).P50
	res.RatioBootVsContainer = ratio(res.BootReadyP50Ms, res.ContainerReadyP50Ms)

	fmt.Fprintf(o.Log, "exec: %d samples each in one microVM and one container\n", o.Execs)
	vm, err := t.create(ctx, vmOpts)
	if err != nil {
		return res, fmt.Errorf("create microvm: %w", err)
	}
	ctr, err := t.create(ctx, ctrOpts)
	if err != nil {
		return res, fmt.Errorf("create container: %w", err)
	}
	var vmExec, ctrExec []time.Duration
	for i := 0; i <= o.Execs; i++ {
		for _, p := range []struct {
			sb  *client.Sandbox
			out *[]time.Duration
		}{{vm, &vmExec}, {ctr, &ctrExec}} {
			start := time.Now()
			if err := runTrue(ctx, p.sb); err != nil {
				return res, err
			}
			if i > 0 { // the first is a warm-up
				*p.out = append(*p.out, time.Since(start))
			}
		}
	}
	res.ExecP50Ms, res.ContainerExecP50Ms = Summarise(vmExec).P50, Summarise(ctrExec).P50
	res.RatioExecVsContainer = ratio(res.ExecP50Ms, res.ContainerExecP50Ms)

	fmt.Fprintln(o.Log, "resume: pause to a memory snapshot, resume, first exec")
	if err := measureResume(ctx, vm, ctr, o, res); err != nil {
		return res, err
	}
	_ = t.delete(ctx, vm)
	_ = t.delete(ctx, ctr)

	fmt.Fprintf(o.Log, "idle memory: %d microVMs, then %d containers\n", o.Idle, o.Idle)
	if err := measureIdle(ctx, t, vmOpts, ctrOpts, o, res); err != nil {
		return res, err
	}
	return res, ctx.Err()
}

// readySamples times create → first `true` done, n times, sequentially.
func readySamples(ctx context.Context, t *tracker, o client.CreateOptions, n int, inspect func(*client.Sandbox)) ([]time.Duration, error) {
	var out []time.Duration
	for len(out) < n {
		start := time.Now()
		sb, err := t.create(ctx, o)
		if err != nil {
			return out, fmt.Errorf("create %s: %w", or(o.Backend, "container"), err)
		}
		err = runTrue(ctx, sb)
		d := time.Since(start)
		if inspect != nil {
			inspect(sb)
		}
		if err := errors.Join(err, t.delete(ctx, sb)); err != nil {
			return out, err
		}
		out = append(out, d)
	}
	return out, nil
}

func or(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}

// measureResume pauses the VM until its snapshot is on disk (the server's
// --microvm-snapshot-after decides when), then times Resume and the first
// exec after it; the container peer is a freezer pause/resume.
func measureResume(ctx context.Context, vm, ctr *client.Sandbox, o MicroVMOptions, res *MicroVMResult) error {
	v := findVMM(vm.ID())
	if v == nil {
		return fmt.Errorf("microvm %s: no VMM process found on this host (run the benchmark on the server's machine)", vm.ID())
	}
	if err := vm.Pause(ctx); err != nil {
		return err
	}
	snap := filepath.Join(v.dir, "memory.snap")
	deadline := time.Now().Add(o.SnapshotMax)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(snap); err == nil && !alive(v.pid) {
			res.Snapshotted = true
			res.SnapshotMiB = round(float64(allocated(snap)) / (1 << 20))
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if !res.Snapshotted {
		res.PausedVMMRSSMiB = round(float64(statusKB(fmt.Sprintf("/proc/%d/status", v.pid), "VmRSS:")) / 1024)
	}
	start := time.Now()
	if err := vm.Resume(ctx); err != nil {
		return err
	}
	res.ResumeMs = ms(time.Since(start))
	if err := runTrue(ctx, vm); err != nil {
		return err
	}
	res.ResumeReadyMs = ms(time.Since(start))
	if err := ctr.Pause(ctx); err != nil {
		return err
	}
	start = time.Now()
	if err := ctr.Resume(ctx); err != nil {
		return err
	}
	res.ContainerResumeMs = ms(time.Since(start))
	return nil
}

// measureIdle creates o.Idle idle microVMs and sums their VMMs' RSS and
// run dir blocks, and reads MemAvailable before and after; then the same
// MemAvailable figure for as many idle containers.
func measureIdle(ctx context.Context, t *tracker, vmOpts, ctrOpts client.CreateOptions, o MicroVMOptions, res *MicroVMResult) error {
	perSandbox := func(opts client.CreateOptions, conc int) ([]*client.Sandbox, float64, error) {
		before, err := settledMemAvailable(ctx)
		if err != nil {
			return nil, 0, err
		}
		sbs := make([]*client.Sandbox, o.Idle)
		errs := make([]error, o.Idle)
		parallel(ctx, o.Idle, conc, func(ctx context.Context, i int) {
			sbs[i], errs[i] = t.create(ctx, opts)
		})
		if err := errors.Join(errs...); err != nil {
			return sbs, 0, err
		}
		after, err := settledMemAvailable(ctx)
		if err != nil {
			return sbs, 0, err
		}
		return sbs, round(float64(before-after) / float64(o.Idle) / (1 << 20)), nil
	}
	deleteAll := func(sbs []*client.Sandbox) {
		for _, sb := range sbs {
			if sb != nil {
				_ = t.delete(ctx, sb)
			}
		}
	}
	vms, perVM, err := perSandbox(vmOpts, 2)
	defer deleteAll(vms)
	if err != nil {
		return err
	}
	res.MemAvailMiBPerVM = perVM
	var rss, files int64
	for _, sb := range vms {
		v := findVMM(sb.ID())
		if v == nil {
			return fmt.Errorf("microvm %s: no VMM process found on this host", sb.ID())
		}
		rss += statusKB(fmt.Sprintf("/proc/%d/status", v.pid), "VmRSS:") << 10
		files += dirAllocated(v.dir)
	}
	n := float64(len(vms))
	res.VMMRSSMiBPerVM = round(float64(rss) / n / (1 << 20))
	res.FilesMiBPerVM = round(float64(files) / n / (1 << 20))
	res.HostMiBPerVM = round(res.VMMRSSMiBPerVM + res.FilesMiBPerVM)
	deleteAll(vms)
	vms = nil
	ctrs, perCtr, err := perSandbox(ctrOpts, 8)
	defer deleteAll(ctrs)
	if err != nil {
		return err
	}
	res.ContainerMiBPerIdle = perCtr
	return nil
}

// vmmInfo is a VMM process found on this host for a sandbox.
type vmmInfo struct {
	pid  int
	dir  string // its run dir (the VMM's working directory)
	kvm  bool
	name string
}

// findVMM finds the VMM of sandbox id by its "-name corral-<id>" or
// "--id corral-<id>" argument.
func findVMM(id string) *vmmInfo {
	for pid, args := range procfs.Cmdlines() {
		if !slices.Contains(args, "corral-"+id) {
			continue
		}
		dir, _ := os.Readlink(procfs.Path(pid, "cwd"))
		v := &vmmInfo{pid: pid, dir: dir, name: filepath.Base(args[0])}
		for i, a := range args {
			if a == "-accel" && i+1 < len(args) && strings.HasPrefix(args[i+1], "kvm") {
				v.kvm = true
			}
		}
		if v.name == "firecracker" {
			v.kvm = true // Firecracker runs on KVM only
		}
		return v
	}
	return nil
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// allocated is the disk space a file really uses (sparse files count only
// their written blocks).
func allocated(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

func dirAllocated(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			total += allocated(p)
		}
		return nil
	})
	return total
}

// WriteTable prints the result.
func (r *MicroVMResult) WriteTable(w io.Writer) error {
	accel := "TCG (no KVM)"
	if r.KVM {
		accel = "KVM"
	}
	resume := "paused in RAM (no snapshot within the wait)"
	if r.Snapshotted {
		resume = fmt.Sprintf("from a %s MiB memory snapshot", f3(r.SnapshotMiB))
	}
	rows := []row{
		{"boot→ready p50 (create→first exec)", f3(r.BootReadyP50Ms) + " ms", fmt.Sprintf("container: %s ms (%sx)", f3(r.ContainerReadyP50Ms), f3(r.RatioBootVsContainer)), ""},
		{"exec true p50", f3(r.ExecP50Ms) + " ms", fmt.Sprintf("container: %s ms (%sx)", f3(r.ContainerExecP50Ms), f3(r.RatioExecVsContainer)), ""},
		{"host MiB per idle VM (VMM RSS + files)", f3(r.HostMiBPerVM), fmt.Sprintf("RSS %s + files %s; guest RAM %d MiB", f3(r.VMMRSSMiBPerVM), f3(r.FilesMiBPerVM), r.GuestRAMMiB), ""},
		{"MemAvailable drop per idle VM", f3(r.MemAvailMiBPerVM) + " MiB", "container: " + f3(r.ContainerMiBPerIdle) + " MiB", ""},
		{"resume", f3(r.ResumeMs) + " ms", resume + "; container: " + f3(r.ContainerResumeMs) + " ms", ""},
		{"resume → first exec done", f3(r.ResumeReadyMs) + " ms", "", ""},
		{"leaked sandboxes", fmt.Sprint(r.Leaked), "", "0"},
	}
	title := fmt.Sprintf("corral bench microvm: image %s, %s via %s, %d idle VMs", r.Image, accel, or(r.VMM, "?"), r.IdleVMs)
	if err := writeTable(w, title, rows); err != nil {
		return err
	}
	fmt.Fprintln(w, r.Load)
	return nil
}
