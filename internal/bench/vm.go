package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/corral-dev/corral/client"
)

// VMOptions configure VM. Zero fields take the defaults.
type VMOptions struct {
	Image       string // VM image (default debian@12)
	PeerImage   string // microvm and container image (default busybox)
	Boots       int    // create→first exec samples of vm (default 1: TCG boots take minutes)
	PeerBoots   int    // the same for microvm and container (default 3)
	Execs       int    // exec samples per backend (default 20)
	Shots       int    // screenshots (default 10)
	MemoryBytes int64  // guest RAM (default 512 MiB)
	Snapshots   int    // snapshot→restore samples of the vm and the microvm (default 2; negative: none)
	Log         io.Writer
}

func (o *VMOptions) defaults() {
	ifZero(&o.Image, "debian@12")
	ifZero(&o.PeerImage, "busybox")
	o.Boots, o.PeerBoots, o.Execs, o.Shots = max(o.Boots, 1), max(o.PeerBoots, 1), max(o.Execs, 1), max(o.Shots, 1)
	ifNotPositive(&o.MemoryBytes, 512<<20)
	ifZero(&o.Snapshots, 2)
	ifZero(&o.Log, io.Discard)
}

// VMResult compares the vm backend with microvm and container sandboxes
// of the same run. Host figures are read from the QEMU processes on this
// host, so run it on the server's machine.
type VMResult struct {
	Image string `json:"image"`
	KVM   bool   `json:"kvm"`

	BootReadyP50Ms        float64 `json:"boot_ready_p50_ms"`
	MicroVMBootReadyP50Ms float64 `json:"microvm_boot_ready_p50_ms"`
	ContainerReadyP50Ms   float64 `json:"container_ready_p50_ms"`
	RatioBootVsMicroVM    float64 `json:"ratio_boot_vs_microvm"`

	ExecP50Ms float64 `json:"exec_p50_ms"` // via qemu-ga
	// AgentExecP50Ms is through the API and corral-agent, on the same VM
	// (0: the image has no corral-agent, and API execs are ExecP50Ms).
	AgentExecP50Ms     float64 `json:"agent_exec_p50_ms"`
	RatioQGAVsAgent    float64 `json:"ratio_qga_vs_agent"`
	MicroVMExecP50Ms   float64 `json:"microvm_exec_p50_ms"`
	ContainerExecP50Ms float64 `json:"container_exec_p50_ms"`
	RatioExecVsMicroVM float64 `json:"ratio_exec_vs_microvm"`

	ScreenshotP50Ms float64 `json:"screenshot_p50_ms"`
	ScreenshotBytes int     `json:"screenshot_bytes"`
	// LiveViewFirstFrameP50Ms: LiveView → websocket → RFB handshake → one
	// full-screen update read whole; the screenshot is its peer.
	LiveViewFirstFrameP50Ms   float64 `json:"liveview_first_frame_p50_ms"`
	RatioLiveViewVsScreenshot float64 `json:"ratio_liveview_vs_screenshot"`

	GuestRAMMiB       int64   `json:"guest_ram_mib"`
	HostMiBPerVM      float64 `json:"host_mib_per_vm"` // QEMU RSS + run dir blocks, idle after boot
	MicroVMHostMiB    float64 `json:"microvm_host_mib_per_vm"`
	RatioHostVsMicroV float64 `json:"ratio_host_vs_microvm"`

	// Snapshot of the running VM (a counter loop in it) and restore into
	// a new sandbox, beside the same for the microvm of the same run.
	SnapshotP50Ms        float64 `json:"snapshot_p50_ms"`
	RestoreP50Ms         float64 `json:"restore_p50_ms"`
	SnapshotMiB          float64 `json:"snapshot_mib"`
	MicroVMSnapshotP50Ms float64 `json:"microvm_snapshot_p50_ms"`
	MicroVMRestoreP50Ms  float64 `json:"microvm_restore_p50_ms"`
	RatioRestoreVsBoot   float64 `json:"ratio_restore_vs_boot"`

	Load   Load `json:"load"`
	Leaked int  `json:"leaked"`
}

// VM measures boot→first exec, exec and screenshot latency and host memory
// of an idle full VM, each beside the microvm and container backends.
func VM(ctx context.Context, c *client.Client, o VMOptions) (res *VMResult, err error) {
	o.defaults()
	t := newTracker(c)
	res = &VMResult{Image: o.Image, GuestRAMMiB: o.MemoryBytes >> 20}
	defer func() { err = t.finish(ctx, &res.Load, &res.Leaked, err) }()
	res.Load.Start, res.Load.CPUs = loadAvg(), runtime.NumCPU()
	r := client.Resources{MemoryBytes: o.MemoryBytes, CPUMillis: 1000}
	vmOpts := client.CreateOptions{Backend: "vm", Image: o.Image, Resources: r}
	mvOpts := client.CreateOptions{Backend: "microvm", Image: o.PeerImage, Resources: client.Resources{MemoryBytes: 256 << 20, CPUMillis: 1000}}
	ctrOpts := client.CreateOptions{Image: o.PeerImage, Resources: r}

	fmt.Fprintf(o.Log, "create→first exec: %d vm, %d microvm, %d container\n", o.Boots, o.PeerBoots, o.PeerBoots)
	// The last VM booted stays for the exec, screenshot and memory
	// figures: a boot under TCG takes minutes.
	var vm *client.Sandbox
	var vmReady []time.Duration
	for i := range o.Boots {
		start := time.Now()
		sb, err := t.create(ctx, vmOpts)
		if err != nil {
			return res, fmt.Errorf("create vm: %w", err)
		}
		if err := runTrue(ctx, sb); err != nil {
			return res, err
		}
		vmReady = append(vmReady, time.Since(start))
		if i < o.Boots-1 {
			if err := t.delete(ctx, sb); err != nil {
				return res, err
			}
		} else {
			vm = sb
		}
	}
	res.BootReadyP50Ms = Summarise(vmReady).P50
	for _, p := range []struct {
		opts client.CreateOptions
		out  *float64
	}{{mvOpts, &res.MicroVMBootReadyP50Ms}, {ctrOpts, &res.ContainerReadyP50Ms}} {
		d, err := readySamples(ctx, t, p.opts, o.PeerBoots, nil)
		if err != nil {
			return res, err
		}
		*p.out = Summarise(d).P50
	}
	res.RatioBootVsMicroVM = ratio(res.BootReadyP50Ms, res.MicroVMBootReadyP50Ms)

	fmt.Fprintf(o.Log, "exec: %d samples in each; screenshots: %d\n", o.Execs, o.Shots)
	mv, err := t.create(ctx, mvOpts)
	if err != nil {
		return res, fmt.Errorf("create microvm: %w", err)
	}
	ctr, err := t.create(ctx, ctrOpts)
	if err != nil {
		return res, fmt.Errorf("create container: %w", err)
	}
	// With corral-agent in the image, API execs go through it, and qemu-ga
	// on the same VM is timed from this host (vmqga.go).
	vmm := findVMM(vm.ID())
	if vmm == nil {
		return res, fmt.Errorf("%s: no QEMU process found on this host (run the benchmark on the server's machine)", vm.ID())
	}
	vmExec := &res.ExecP50Ms
	if hasCorralAgent(vmm.pid) {
		vmExec = &res.AgentExecP50Ms
		if res.ExecP50Ms, err = qgaSamples(ctx, vmm.dir, o.Execs); err != nil {
			return res, err
		}
	}
	for _, p := range []struct {
		sb  *client.Sandbox
		out *float64
	}{{vm, vmExec}, {mv, &res.MicroVMExecP50Ms}, {ctr, &res.ContainerExecP50Ms}} {
		var d []time.Duration
		for i := 0; i <= o.Execs; i++ {
			start := time.Now()
			if err := runTrue(ctx, p.sb); err != nil {
				return res, err
			}
			if i > 0 { // the first is a warm-up
				d = append(d, time.Since(start))
			}
		}
		*p.out = Summarise(d).P50
	}
	res.RatioExecVsMicroVM = ratio(res.ExecP50Ms, res.MicroVMExecP50Ms)
	if res.AgentExecP50Ms > 0 {
		res.RatioQGAVsAgent = ratio(res.ExecP50Ms, res.AgentExecP50Ms)
	}
	var shots []time.Duration
	for range o.Shots {
		start := time.Now()
		shot, err := c.Screenshot(ctx, vm.ID(), 0)
		if err != nil {
			return res, err
		}
		shots = append(shots, time.Since(start))
		res.ScreenshotBytes = len(shot.PNG)
	}
	res.ScreenshotP50Ms = Summarise(shots).P50
	views, err := liveViewFirstFrame(ctx, c, vm.ID(), o.Shots)
	if err != nil {
		return res, err
	}
	res.LiveViewFirstFrameP50Ms = Summarise(views).P50
	res.RatioLiveViewVsScreenshot = ratio(res.LiveViewFirstFrameP50Ms, res.ScreenshotP50Ms)

	host := func(sb *client.Sandbox) (float64, bool, error) {
		v := findVMM(sb.ID())
		if v == nil {
			return 0, false, fmt.Errorf("%s: no QEMU process found on this host (run the benchmark on the server's machine)", sb.ID())
		}
		rss := statusKB(fmt.Sprintf("/proc/%d/status", v.pid), "VmRSS:") << 10
		return round(float64(rss+dirAllocated(v.dir)) / (1 << 20)), v.kvm, nil
	}
	if res.HostMiBPerVM, res.KVM, err = host(vm); err != nil {
		return res, err
	}
	if res.MicroVMHostMiB, _, err = host(mv); err != nil {
		return res, err
	}
	res.RatioHostVsMicroV = ratio(res.HostMiBPerVM, res.MicroVMHostMiB)
	if o.Snapshots > 0 {
		fmt.Fprintf(o.Log, "snapshot→restore: %d in each of vm and microvm\n", o.Snapshots)
		if err := vmSnapshots(ctx, t, vm, mv, o.Snapshots, res); err != nil {
			return res, err
		}
	}
	for _, sb := range []*client.Sandbox{vm, mv, ctr} {
		_ = t.delete(ctx, sb)
	}
	return res, ctx.Err()
}

// vmSnapshots times snapshot→restore of the running vm and microvm (a
// counter loop in each, so that memory changes between samples).
func vmSnapshots(ctx context.Context, t *tracker, vm, mv *client.Sandbox, n int, res *VMResult) error {
	for _, p := range []struct {
		sb            *client.Sandbox
		snap, restore *float64
		mib           *float64
	}{{vm, &res.SnapshotP50Ms, &res.RestoreP50Ms, &res.SnapshotMiB}, {mv, &res.MicroVMSnapshotP50Ms, &res.MicroVMRestoreP50Ms, nil}} {
		if _, err := p.sb.Run(ctx, client.Command{Shell: "(i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.2; done) >/dev/null 2>&1 &"}); err != nil {
			return err
		}
		snaps, restores, bytes, err := snapshotRestores(ctx, t, p.sb, n)
		if err != nil {
			return fmt.Errorf("%s snapshots: %w", p.sb.ID(), err)
		}
		*p.snap, *p.restore = Summarise(snaps).P50, Summarise(restores).P50
		if p.mib != nil {
			*p.mib = round(float64(bytes) / (1 << 20))
		}
	}
	res.RatioRestoreVsBoot = ratio(res.RestoreP50Ms, res.BootReadyP50Ms)
	return nil
}

// WriteTable prints the result.
func (r *VMResult) WriteTable(w io.Writer) error {
	accel := "TCG (no KVM)"
	if r.KVM {
		accel = "KVM"
	}
	agentRow := row{"exec true p50 via corral-agent", "n/a", "image without corral-agent: execs go through qemu-ga", ""}
	if r.AgentExecP50Ms > 0 {
		agentRow = row{"exec true p50 via corral-agent", f3(r.AgentExecP50Ms) + " ms", fmt.Sprintf("same VM via qemu-ga: %s ms (%sx slower); microvm agent: %s ms", f3(r.ExecP50Ms), f3(r.RatioQGAVsAgent), f3(r.MicroVMExecP50Ms)), ""}
	}
	rows := []row{
		{"boot→ready p50 (create→first exec)", f3(r.BootReadyP50Ms) + " ms", fmt.Sprintf("microvm: %s ms (%sx); container: %s ms", f3(r.MicroVMBootReadyP50Ms), f3(r.RatioBootVsMicroVM), f3(r.ContainerReadyP50Ms)), ""},
		{"exec true p50 via guest agent (qemu-ga)", f3(r.ExecP50Ms) + " ms", fmt.Sprintf("microvm agent: %s ms (%sx); container: %s ms", f3(r.MicroVMExecP50Ms), f3(r.RatioExecVsMicroVM), f3(r.ContainerExecP50Ms)), ""},
		agentRow,
		{"screenshot p50 (QMP screendump → PNG)", f3(r.ScreenshotP50Ms) + " ms", fmt.Sprintf("%d bytes", r.ScreenshotBytes), ""},
		{"live view first full frame p50 (token → websocket → RFB)", f3(r.LiveViewFirstFrameP50Ms) + " ms", fmt.Sprintf("screenshot: %s ms (%sx)", f3(r.ScreenshotP50Ms), f3(r.RatioLiveViewVsScreenshot)), ""},
		{"host MiB per idle VM (QEMU RSS + files)", f3(r.HostMiBPerVM), fmt.Sprintf("microvm: %s (%sx); guest RAM %d MiB", f3(r.MicroVMHostMiB), f3(r.RatioHostVsMicroV), r.GuestRAMMiB), ""},
	}
	if r.SnapshotP50Ms > 0 {
		rows = append(rows,
			row{"snapshot of the running VM p50", f3(r.SnapshotP50Ms) + " ms", fmt.Sprintf("%s MiB on disk; microvm: %s ms (%sx)", f3(r.SnapshotMiB), f3(r.MicroVMSnapshotP50Ms), f3(ratio(r.SnapshotP50Ms, r.MicroVMSnapshotP50Ms))), ""},
			row{"restore into a new sandbox p50", f3(r.RestoreP50Ms) + " ms", fmt.Sprintf("microvm: %s ms (%sx); the VM's cold boot %s ms (%sx)", f3(r.MicroVMRestoreP50Ms), f3(ratio(r.RestoreP50Ms, r.MicroVMRestoreP50Ms)), f3(r.BootReadyP50Ms), f3(r.RatioRestoreVsBoot)), ""})
	}
	rows = append(rows, row{"leaked sandboxes", fmt.Sprint(r.Leaked), "", "0"})
	if err := writeTable(w, fmt.Sprintf("corral bench vm: image %s, %s", r.Image, accel), rows); err != nil {
		return err
	}
	fmt.Fprintln(w, r.Load)
	return nil
}
