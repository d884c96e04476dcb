package node

import (
	"fmt"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/state"
	"golang.org/x/sys/unix"
)

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// Defaults fill in what a request leaves out.
type Defaults struct {
	Backend     string
	Image       string
	CPUMillis   int64
	MemoryBytes int64
	DiskBytes   int64
	Pids        int64
	IdleTimeout time.Duration
	MaxLifetime time.Duration
	ExecTimeout time.Duration
	OutputLimit int64
}

func (d Defaults) withFallbacks() Defaults {
	fallback := Defaults{
		Backend: "container", Image: "busybox",
		CPUMillis: 1000, MemoryBytes: 512 * mib, DiskBytes: 1 * gib, Pids: 512,
		IdleTimeout: 30 * time.Minute, MaxLifetime: 24 * time.Hour,
		ExecTimeout: 10 * time.Minute, OutputLimit: 4 * mib,
	}
	fill(&d.Backend, fallback.Backend)
	fill(&d.Image, fallback.Image)
	fill(&d.CPUMillis, fallback.CPUMillis)
	fill(&d.MemoryBytes, fallback.MemoryBytes)
	fill(&d.DiskBytes, fallback.DiskBytes)
	fill(&d.Pids, fallback.Pids)
	fill(&d.IdleTimeout, fallback.IdleTimeout)
	fill(&d.MaxLifetime, fallback.MaxLifetime)
	fill(&d.ExecTimeout, fallback.ExecTimeout)
	fill(&d.OutputLimit, fallback.OutputLimit)
	return d
}

// Limits bound what a request may ask for.
type Limits struct {
	MaxCPUMillis   int64
	MaxMemoryBytes int64
	MaxDiskBytes   int64
	MaxPids        int64
	MaxLifetime    time.Duration
	MaxExecTimeout time.Duration
	MaxOutputLimit int64

	// MaxIO is the most disk I/O a request may ask for, each field its
	// backend's own limit (zero: no bound but the backend's).
	MaxIO state.IOLimits
}

func (l Limits) withFallbacks() Limits {
	fill(&l.MaxCPUMillis, int64(runtime.NumCPU())*1000)
	fill(&l.MaxMemoryBytes, hostMemory())
	fill(&l.MaxDiskBytes, 64*gib)
	fill(&l.MaxPids, 32768)
	fill(&l.MaxLifetime, 7*24*time.Hour)
	fill(&l.MaxExecTimeout, 24*time.Hour)
	fill(&l.MaxOutputLimit, 256*mib)
	return l
}

// The floors: below them a sandbox cannot even start its init.
const (
	minCPUMillis   = 10
	minMemoryBytes = 16 * mib
	minDiskBytes   = 1 * mib
	minPids        = 16

	maxEnvEntries  = 1024
	maxEnvBytes    = 256 * kib
	maxArgs        = 8192
	maxArgvBytes   = 1 * mib
	maxPathLen     = 4096
	maxLabels      = 64
	maxLabelValue  = 256
	maxStdinBytes  = 16 * mib
	inodeBytesRate = 4 * kib // one inode per 4 KiB of disk quota
	minDiskInodes  = 4096
)

func fill[T comparable](v *T, fallback T) {
	var zero T
	if *v == zero {
		*v = fallback
	}
}

func hostMemory() int64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 1 << 40
	}
	return int64(si.Totalram) * int64(si.Unit)
}

func checkRange(field string, v, lo, hi int64, unit string) error {
	if v < lo || v > hi {
		return errdefs.InvalidArgument("%s: %d%s is out of range (allowed %d%s to %d%s)", field, v, unit, lo, unit, hi, unit)
	}
	return nil
}

func checkDuration(field string, v, hi time.Duration) error {
	if v < 0 || v > hi {
		return errdefs.InvalidArgument("%s: %s is out of range (allowed 0s to %s)", field, v, hi)
	}
	return nil
}

func checkEnv(field string, env []string) error {
	if len(env) > maxEnvEntries {
		return errdefs.InvalidArgument("%s: %d entries is over the limit of %d", field, len(env), maxEnvEntries)
	}
	total := 0
	for i, kv := range env {
		total += len(kv)
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsRune(kv, 0) {
			return errdefs.InvalidArgument("%s[%d]: %q is not KEY=VALUE", field, i, truncate(kv))
		}
	}
	if int64(total) > maxEnvBytes {
		return errdefs.InvalidArgument("%s: %d bytes is over the limit of %d", field, total, maxEnvBytes)
	}
	return nil
}

func checkAbsPath(field, p string) error {
	if p == "" {
		return nil
	}
	if len(p) > maxPathLen || !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
		return errdefs.InvalidArgument("%s: %q must be an absolute path of at most %d bytes", field, truncate(p), maxPathLen)
	}
	return nil
}

var userPattern = regexp.MustCompile(`^([a-z_][a-z0-9_.-]{0,31}|[0-9]{1,10}(:[0-9]{1,10})?)$`)

func checkUser(field, u string) error {
	if u != "" && !userPattern.MatchString(u) {
		return errdefs.InvalidArgument("%s: %q is neither a user name nor uid[:gid]", field, truncate(u))
	}
	return nil
}

var labelKeyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)

func checkLabels(labels map[string]string) error {
	if len(labels) > maxLabels {
		return errdefs.InvalidArgument("labels: %d labels is over the limit of %d", len(labels), maxLabels)
	}
	for k, v := range labels {
		if !labelKeyPattern.MatchString(k) {
			return errdefs.InvalidArgument("labels: key %q must match %s", truncate(k), labelKeyPattern)
		}
		if len(v) > maxLabelValue {
			return errdefs.InvalidArgument("labels[%s]: value of %d bytes is over the limit of %d", k, len(v), maxLabelValue)
		}
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// formatBytes renders a limit for error messages: 512MiB, 23.54GiB.
func formatBytes(n int64) string {
	for _, u := range []struct {
		size int64
		name string
	}{{gib, "GiB"}, {mib, "MiB"}, {kib, "KiB"}} {
		switch {
		case n >= u.size && n%u.size == 0:
			return fmt.Sprintf("%d%s", n/u.size, u.name)
		case n >= u.size:
			return fmt.Sprintf("%.2f%s", float64(n)/float64(u.size), u.name)
		}
	}
	return fmt.Sprintf("%dB", n)
}

var imageNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}(@[A-Za-z0-9._-]{1,64})?$`)
