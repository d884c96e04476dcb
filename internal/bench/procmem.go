package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/procfs"
)

// ReadMemAvailable returns MemAvailable from /proc/meminfo, in bytes.
func ReadMemAvailable() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return parseMemAvailable(b)
}

func parseMemAvailable(meminfo []byte) (int64, error) {
	for line := range bytes.Lines(meminfo) {
		f := strings.Fields(string(line))
		if len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
}

// settledMemAvailable reads MemAvailable once a second until three readings
// in a row lie within 4 MiB (at most 20 s) and returns their median. Nothing
// is dropped from the caches first: the figure is what the host has left.
func settledMemAvailable(ctx context.Context) (int64, error) {
	const spread = 4 << 20
	var last []int64
	for i := 0; i < 20; i++ {
		v, err := ReadMemAvailable()
		if err != nil {
			return 0, err
		}
		last = append(last, v)
		if len(last) > 3 {
			last = last[1:]
		}
		if len(last) == 3 && slices.Max(last)-slices.Min(last) <= spread {
			break
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	s := slices.Clone(last)
	slices.Sort(s)
	return s[len(s)/2], nil
}

// ProcMemory sums the memory of the host processes whose cgroup path names
// one of the sandboxes (found by scanning /proc; it needs the server on
// this host and sandbox ids in cgroup paths).
type ProcMemory struct {
	Processes int     `json:"processes"`
	Threads   int64   `json:"threads"` // host PIDs the processes hold
	Cgroups   int     `json:"cgroups"`
	RSSMiB    float64 `json:"rss_mib"`
	PSSMiB    float64 `json:"pss_mib"`
	CgroupMiB float64 `json:"cgroup_usage_mib"` // sum of the memory cgroups' usage
}

// sandboxProcMemory returns nil when no process matched.
func sandboxProcMemory(ids []string) *ProcMemory {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	pm := &ProcMemory{}
	cgroups := map[string]bool{}
	var rss, pss, usage int64
	for pid := range procfs.PIDs() {
		cg, err := os.ReadFile(procfs.Path(pid, "cgroup"))
		if err != nil || !namesSandbox(cg, want, ids) {
			continue
		}
		pm.Processes++
		pm.Threads += statusKB(procfs.Path(pid, "status"), "Threads:")
		rss += statusKB(procfs.Path(pid, "status"), "VmRSS:") << 10
		pss += statusKB(procfs.Path(pid, "smaps_rollup"), "Pss:") << 10
		if p := memoryCgroupUsageFile(cg); p != "" && !cgroups[p] {
			cgroups[p] = true
			if b, err := os.ReadFile(p); err == nil {
				n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				usage += n
			}
		}
	}
	if pm.Processes == 0 {
		return nil
	}
	pm.Cgroups, pm.RSSMiB, pm.PSSMiB, pm.CgroupMiB = len(cgroups), mib(rss), mib(pss), mib(usage)
	return pm
}

// namesSandbox reports whether a /proc/PID/cgroup file has a path element
// equal to, or containing, one of the ids.
func namesSandbox(cg []byte, want map[string]bool, ids []string) bool {
	for line := range bytes.Lines(cg) {
		_, path, ok := cutLast(string(bytes.TrimSpace(line)))
		if !ok || path == "/" {
			continue
		}
		for _, elem := range strings.Split(path, "/") {
			if want[elem] {
				return true
			}
		}
		for _, id := range ids {
			if strings.Contains(path, id) {
				return true
			}
		}
	}
	return false
}

// cutLast splits "N:controllers:path" into controllers and path.
func cutLast(line string) (controllers, path string, ok bool) {
	parts := strings.SplitN(line, ":", 3)
	if len(parts) != 3 {
		return "", "", false
	}
	return parts[1], parts[2], true
}

// memoryCgroupUsageFile names the usage file of a process's memory cgroup:
// the v1 memory hierarchy if it has one, else the v2 one.
func memoryCgroupUsageFile(cg []byte) string {
	v2 := ""
	for line := range bytes.Lines(cg) {
		ctrls, path, ok := cutLast(string(bytes.TrimSpace(line)))
		if !ok {
			continue
		}
		if slices.Contains(strings.Split(ctrls, ","), "memory") {
			return filepath.Join("/sys/fs/cgroup/memory", path, "memory.usage_in_bytes")
		}
		if ctrls == "" {
			for _, root := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
				p := filepath.Join(root, path, "memory.current")
				if _, err := os.Stat(p); err == nil {
					v2 = p
					break
				}
			}
		}
	}
	return v2
}

// statusKB reads a "Key: N kB" line from a /proc file, 0 if absent.
func statusKB(file, key string) int64 {
	f, err := os.Open(file)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[0] == key {
			n, _ := strconv.ParseInt(fs[1], 10, 64)
			return n
		}
	}
	return 0
}

// Load is the host's 1-minute load average at the start and end of a run,
// reported so that a reader can tell a quiet machine from a busy one.
type Load struct {
	Start float64 `json:"start_1m"`
	End   float64 `json:"end_1m"`
	CPUs  int     `json:"cpus"`
}

func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func (l Load) String() string {
	return fmt.Sprintf("host load (1 min) %.2f at start, %.2f at end, on %d CPUs", l.Start, l.End, l.CPUs)
}
