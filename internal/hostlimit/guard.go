// Package hostlimit turns the host's limits into admission limits. At start
// it reads what bounds how many sandboxes a node can hold — host PIDs
// (kernel.pid_max, kernel.threads-max, pids cgroups above the sandboxes),
// memory, the daemon's own file descriptors, disk and inodes of the data
// dir (loop devices and inotify are only reported) — raises what it may
// (with a log line), and keeps a reserve of each for the host and the node itself. A create that
// would cross a limit is refused with ResourceExhausted naming the
// resource, its limit and its use, before anything of the sandbox is made;
// the sandboxes' parent pids cgroup is capped below the host's PID limit,
// so that busy sandboxes cannot take the node's reserve either.
//
// It owns no sandbox state: use is read from the kernel, and the cost of a
// sandbox is tracked from the sandboxes' own cgroups. It imports errdefs,
// the cgroup package's layout detection and runtime/spare only, never node,
// backend or server.
package hostlimit

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/runtime/spare"
	"golang.org/x/sys/unix"
)

// Cost is what one idle sandbox of a backend takes from the host.
type Cost struct {
	// PIDs are the tasks in the sandbox's cgroup when idle (its init's
	// threads); tracked from the running sandboxes when there are enough.
	PIDs int64
	// KernelPIDs are kernel threads made for the sandbox (e.g. the rescuer
	// of an ext4 writable layer's workqueue), outside any cgroup.
	KernelPIDs int64
	// ServePIDs are what a sandbox takes on top of its idle PIDs to serve
	// an exec (a container's init starts its Go server: its threads and
	// the command). They are kept free for Config.ServingShare of the
	// sandboxes held, so that creates are refused before execs into the
	// sandboxes held fail.
	ServePIDs   int64
	MemoryBytes int64
	FDs         int64 // the daemon's descriptors held per sandbox
	DiskBytes   int64 // of the data dir, idle
	Inodes      int64
}

func (c Cost) add(o Cost) Cost {
	return Cost{c.PIDs + o.PIDs, c.KernelPIDs + o.KernelPIDs, c.ServePIDs + o.ServePIDs, c.MemoryBytes + o.MemoryBytes,
		c.FDs + o.FDs, c.DiskBytes + o.DiskBytes, c.Inodes + o.Inodes}
}

// DefaultCosts are measured on the development host (docs/limits.md): a
// container sandbox's idle corral-init and its ext4 writable layer, and a
// microVM's QEMU (its guest memory is charged per create by the caller).
var DefaultCosts = map[string]Cost{
	"container": {PIDs: 7, KernelPIDs: 1, MemoryBytes: 2 << 20, FDs: 3, DiskBytes: 1 << 20, Inodes: 8},
	"microvm":   {PIDs: 16, MemoryBytes: 64 << 20, FDs: 16, DiskBytes: 8 << 20, Inodes: 16},
	"vm":        {PIDs: 16, MemoryBytes: 64 << 20, FDs: 16, DiskBytes: 8 << 20, Inodes: 16},
}

// StubContainerCost is a container sandbox's cost when its PID 1 is the
// one-thread init stub (`corral serve --init-stub`): the stub, and kept
// free for every sandbox held, the Go server with a command it starts for
// an exec.
var StubContainerCost = Cost{PIDs: 1, KernelPIDs: 1, ServePIDs: 8, MemoryBytes: 2 << 20, FDs: 3, DiskBytes: 1 << 20, Inodes: 8}

// Targets of raising.
const (
	raisePidMax = 4194304 // the kernel's maximum on 64-bit hosts
)

// sampleEvery is how stale the kernel's figures may be for a decision;
// creates admitted since the last reading are added at their cost.
const sampleEvery = 250 * time.Millisecond

// Config configures Open.
type Config struct {
	// DataDir holds the writable layers and run files.
	DataDir string
	// SandboxParents are the cgroup parents the sandboxes are made under
	// (e.g. "corral" and "corral-besteffort").
	SandboxParents []string
	// NoRaise leaves every host setting as it is.
	NoRaise bool
	// Costs override DefaultCosts per backend.
	Costs map[string]Cost
	// ServingShare is the share of the sandboxes held that may serve at
	// once, each with its ServePIDs: 0 means 1, every one. A node whose
	// sandboxes start a server per exec, which lingers a moment after,
	// holds more sandboxes with less; an exec beyond it meets the
	// sandboxes' PIDs cap, a ResourceExhausted refusal of that exec.
	ServingShare float64
	// SpareThreads are idle OS threads the daemon keeps (see
	// SpareThreads), topped up at each reading while the host has PIDs.
	SpareThreads int
	Logger       *slog.Logger
}

// resource is one limit and how much of it is in use.
type resource struct {
	name    string // what the refusal names, e.g. "host PIDs (kernel.pid_max)"
	bytes   bool   // format as bytes
	limit   int64
	reserve int64
	use     func() (int64, error)
	need    func(Cost) int64
	used    int64
	readErr error // of the last reading; the resource is skipped while set
	// everyTime: read at every decision, not only every sampleEvery.
	// PIDs are (a counter file each, microseconds): sandboxes already
	// running can take hundreds between two readings.
	everyTime bool
}

// Guard admits creates against the host's limits.
type Guard struct {
	cfg      Config
	log      *slog.Logger
	res      []*resource
	pidsDirs []string // the sandbox parents in the pids hierarchy
	pidCap   int64    // pids.max written on pidsDirs (0: none)

	mu        sync.Mutex
	sampledAt time.Time
	since     Cost  // admitted since the last reading
	inCgroups int64 // tasks in the sandbox parents at the last reading
	tracked   int64 // PIDs per sandbox tracked from inCgroups (0: too few to tell)
	threads   int64 // the daemon's threads after the last top-up
}

// Open reads the host's limits, raises what it may unless cfg.NoRaise, and
// logs each limit with its use and reserve.
func Open(cfg Config) (*Guard, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	g := &Guard{cfg: cfg, log: cfg.Logger}
	if !cfg.NoRaise {
		g.raise()
	}
	if err := g.addPIDs(); err != nil {
		return nil, err
	}
	g.addMemory()
	g.addFds()
	g.logLoops()
	if err := g.addDisk(); err != nil {
		return nil, err
	}
	g.logInotify()
	g.mu.Lock()
	g.sample()
	g.mu.Unlock()
	for _, r := range g.res {
		g.log.Info("host limit", "resource", r.name, "limit", r.format(r.limit), "in_use", r.format(r.used), "reserved", r.format(r.reserve))
	}
	return g, nil
}

func (r *resource) format(v int64) string {
	if r.bytes {
		return fmt.Sprintf("%.1fMiB", float64(v)/(1<<20))
	}
	return fmt.Sprint(v)
}

// reserveOf keeps max(floor, 5%) of a limit for the host and the node.
func reserveOf(limit, floor int64) int64 { return min(limit/2, max(floor, limit/20)) }

// raise lifts the host settings that only cost kernel memory when used.
func (g *Guard) raise() {
	raiseSysctl := func(name string, to int64) {
		path := filepath.Join(procRoot, "sys", strings.ReplaceAll(name, ".", "/"))
		cur, err := readInt(path)
		if err != nil || cur >= to {
			return
		}
		if err := writeInt(path, to); err != nil {
			g.log.Warn("host limit: cannot raise", "sysctl", name, "from", cur, "to", to, "err", err)
			return
		}
		g.log.Info("host limit raised (--no-raise-limits leaves it)", "sysctl", name, "from", cur, "to", to)
	}
	raiseSysctl("kernel.pid_max", raisePidMax)
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur < rl.Max {
		from := rl.Cur
		rl.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &rl); err == nil {
			g.log.Info("host limit raised", "rlimit", "nofile (soft to hard)", "from", from, "to", rl.Max)
		}
	}
}

func pidsNeed(c Cost) int64 { return c.PIDs + c.KernelPIDs + c.ServePIDs }

// addPIDs adds the host-wide PID limits and every finite pids.max above
// the sandbox parents, and caps the parents below the tightest of them.
func (g *Guard) addPIDs() error {
	for _, k := range []struct{ sysctl, file string }{
		{"kernel.pid_max", "sys/kernel/pid_max"},
		{"kernel.threads-max", "sys/kernel/threads-max"},
	} {
		limit, err := readInt(filepath.Join(procRoot, k.file))
		if err != nil {
			return fmt.Errorf("host limit %s: %w", k.sysctl, err)
		}
		g.res = append(g.res, &resource{name: "host PIDs (" + k.sysctl + ")", limit: limit,
			reserve: reserveOf(limit, 1024), use: tasks, need: pidsNeed, everyTime: true})
	}
	h, err := cgroup.Detect()
	if err != nil {
		return err
	}
	root := h.V1["pids"]
	if root == "" && h.V2Controllers["pids"] {
		root = h.V2
	}
	if root == "" {
		return nil
	}
	seen := map[string]bool{}
	for _, p := range g.cfg.SandboxParents {
		g.pidsDirs = append(g.pidsDirs, filepath.Join(root, p))
		for d := filepath.Dir(filepath.Join(root, p)); len(d) > len(root); d = filepath.Dir(d) {
			if seen[d] {
				continue
			}
			seen[d] = true
			limit, err := readInt(filepath.Join(d, "pids.max"))
			if err != nil || limit < 0 {
				continue
			}
			dir := d
			g.res = append(g.res, &resource{name: "PIDs of cgroup " + strings.TrimPrefix(d, root) + " (pids.max)",
				limit: limit, reserve: reserveOf(limit, 64), need: pidsNeed, everyTime: true,
				use: func() (int64, error) { return readInt(filepath.Join(dir, "pids.current")) }})
		}
	}
	// The cap sits halfway into the reserve: admission stops at the
	// reserve, the sandboxes already there may still fork into the first
	// half (an exec, init's threads), and the second half stays the node's.
	for _, r := range g.res {
		if c := r.limit - r.reserve/2; c > 0 && (g.pidCap == 0 || c < g.pidCap) {
			g.pidCap = c
		}
	}
	return nil
}

func (g *Guard) addMemory() {
	total, _, err := memInfo()
	if err != nil {
		g.log.Warn("host limit: memory not read", "err", err)
		return
	}
	g.res = append(g.res, &resource{name: "host memory (MemAvailable)", bytes: true, limit: total,
		reserve: reserveOf(total, 512<<20), need: func(c Cost) int64 { return c.MemoryBytes },
		use: func() (int64, error) {
			total, avail, err := memInfo()
			return total - avail, err
		}})
}

func (g *Guard) addFds() {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == unix.RLIM_INFINITY {
		return
	}
	limit := int64(rl.Cur)
	g.res = append(g.res, &resource{name: "the node's file descriptors (RLIMIT_NOFILE)", limit: limit,
		reserve: reserveOf(limit, 256), use: openFds, need: func(c Cost) int64 { return c.FDs }})
}

// logLoops reports the loop devices. They are made on demand through
// loop-control up to 2^20 minors, far past any other limit, and counting
// the bound ones means a sysfs lookup per device (58 ms for 441 devices
// here): reported at start, not admitted on.
func (g *Guard) logLoops() {
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return
	}
	bound, err := loopsBound()
	if err == nil {
		g.log.Info("host limit", "resource", "loop devices (made on demand; reported only)", "limit", loopLimit(), "in_use", bound)
	}
}

func (g *Guard) addDisk() error {
	bytes, _, inodes, _, err := statfs(g.cfg.DataDir)
	if err != nil {
		return fmt.Errorf("host limit: data dir: %w", err)
	}
	dir := g.cfg.DataDir
	g.res = append(g.res, &resource{name: "disk of the data dir " + dir, bytes: true, limit: bytes,
		reserve: reserveOf(bytes, 1<<30), need: func(c Cost) int64 { return c.DiskBytes },
		use: func() (int64, error) {
			_, used, _, _, err := statfs(dir)
			return used, err
		}})
	if inodes > 0 { // some filesystems (btrfs) report none
		g.res = append(g.res, &resource{name: "inodes of the data dir " + dir, limit: inodes,
			reserve: reserveOf(inodes, 10000), need: func(c Cost) int64 { return c.Inodes },
			use: func() (int64, error) {
				_, _, _, used, err := statfs(dir)
				return used, err
			}})
	}
	return nil
}

// logInotify reports the inotify limits. They are per user, and each
// sandbox's user namespace belongs to a uid of its own, so they bound each
// sandbox alone, not how many fit: reported, not admitted on, and not
// raised (that would give every sandbox more kernel objects).
func (g *Guard) logInotify() {
	inst, err1 := readInt(filepath.Join(procRoot, "sys/fs/inotify/max_user_instances"))
	watches, err2 := readInt(filepath.Join(procRoot, "sys/fs/inotify/max_user_watches"))
	if err1 == nil && err2 == nil {
		g.log.Info("host limit", "resource", "inotify (per user; reported only)", "max_user_instances", inst, "max_user_watches", watches)
	}
}

// sample reads every resource's use; the caller holds g.mu.
func (g *Guard) sample() {
	for _, r := range g.res {
		r.read(g.log)
	}
	g.inCgroups = 0
	for _, d := range g.pidsDirs {
		if n, err := readInt(filepath.Join(d, "pids.current")); err == nil {
			g.inCgroups += n
		}
		g.applyCap(d)
	}
	g.topUpThreads()
	g.sampledAt = time.Now()
	g.since = Cost{}
}

// topUpThreads restores the daemon's idle threads (a goroutine that ends
// locked to its thread, as the sandbox spawn's does, ends the thread too),
// but only while every PID limit has room for twice as many: making
// threads is what must not happen when PIDs run out.
func (g *Guard) topUpThreads() {
	n := int64(g.cfg.SpareThreads)
	if n == 0 {
		return
	}
	if have, err := ownThreads(); err == nil && g.threads > 0 && have >= g.threads {
		return // none was ended since the last top-up
	}
	for _, r := range g.res {
		if r.need != nil && isPIDs(r) && (r.readErr != nil || r.limit-r.used < 2*n) {
			return
		}
	}
	spare.Threads(int(n))
	g.threads, _ = ownThreads()
}

func isPIDs(r *resource) bool { return r.need(Cost{PIDs: 1}) == 1 }

// read takes the resource's use from the kernel.
func (r *resource) read(log *slog.Logger) {
	used, err := r.use()
	if err != nil && r.readErr == nil {
		log.Warn("host limit: cannot read use; not admitting on it", "resource", r.name, "err", err)
	}
	r.used, r.readErr = used, err
}

// applyCap writes the parent's pids.max once the parent exists (the
// backend makes it with its first sandbox). The node owns its parents
// (they are claimed at start), so a cap left by an earlier run under other
// limits is replaced.
func (g *Guard) applyCap(dir string) {
	if g.pidCap <= 0 {
		return
	}
	cur, err := readInt(filepath.Join(dir, "pids.max"))
	if err != nil || cur == g.pidCap {
		return
	}
	if err := writeInt(filepath.Join(dir, "pids.max"), g.pidCap); err != nil {
		g.log.Warn("host limit: cannot cap the sandboxes' PIDs", "cgroup", dir, "err", err)
		return
	}
	g.log.Info("host limit: sandboxes' PIDs capped below the host's", "cgroup", dir, "pids.max", g.pidCap)
}

// cost is one idle sandbox of backend; the caller holds g.mu.
func (g *Guard) cost(backend string) Cost {
	c, ok := g.cfg.Costs[backend]
	if !ok {
		c = DefaultCosts[backend]
	}
	if backend == "container" && g.tracked > c.PIDs {
		c.PIDs = g.tracked
	}
	return c
}

// serving is how many of sandboxes held may serve at once.
func (g *Guard) serving(sandboxes int) int64 {
	share := g.cfg.ServingShare
	if share <= 0 || share > 1 {
		share = 1
	}
	return int64(math.Ceil(float64(sandboxes) * share))
}

// Admit decides on one create of backend; sandboxes is how many the node
// holds now (for tracking the PIDs each takes), creating how many of them
// are still being made. A sandbox being made is counted at its full cost
// on top of the kernel's figures (its init has not started all its threads
// yet), and so is, for the figures read every sampleEvery, every create
// admitted since they were read.
func (g *Guard) Admit(backend string, sandboxes, creating int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if time.Since(g.sampledAt) >= sampleEvery {
		g.sample()
		for range creating {
			g.since = g.since.add(g.cost(backend))
		}
		// Busy sandboxes count too: the figure is what a sandbox of this
		// node takes on average, never below the idle estimate.
		if sandboxes >= 8 {
			g.tracked = (g.inCgroups + int64(sandboxes) - 1) / int64(sandboxes)
		}
	}
	c := g.cost(backend)
	var inflight Cost
	for range creating {
		inflight = inflight.add(c)
	}
	// The serving headroom of the sandboxes held that may serve at once,
	// each taken for a container, whether in use (then also in the
	// reading: kept twice, on the safe side) or not.
	headroom := Cost{ServePIDs: g.serving(sandboxes) * g.cost("container").ServePIDs}
	for _, r := range g.res {
		need := r.need(c)
		if need == 0 {
			continue
		}
		if r.everyTime {
			r.read(g.log)
		}
		if r.readErr != nil {
			continue
		}
		// A fresh reading misses only the sandboxes still being made;
		// a sampled one also those admitted since.
		pending := g.since
		if r.everyTime {
			pending = inflight
		}
		used := r.used + r.need(pending.add(headroom))
		if used+need > r.limit-r.reserve {
			return errdefs.ResourceExhausted("node at a host limit: %s: limit %s, in use %s, %s kept for the host and the node; a %s sandbox needs %s",
				r.name, r.format(r.limit), r.format(used), r.format(r.reserve), backend, r.format(need))
		}
	}
	g.since = g.since.add(c)
	return nil
}
