package iam

import (
	"context"
	"fmt"
	"math"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Usage is what live sandboxes use: the concurrent resources a quota
// bounds.
type Usage struct {
	Sandboxes   int64 `json:"sandboxes"`
	CPUMillis   int64 `json:"cpu_millis"`
	MemoryBytes int64 `json:"memory_bytes"`
	DiskBytes   int64 `json:"disk_bytes"`
}

// Add returns u plus v.
func (u Usage) Add(v Usage) Usage {
	return Usage{u.Sandboxes + v.Sandboxes, u.CPUMillis + v.CPUMillis, u.MemoryBytes + v.MemoryBytes, u.DiskBytes + v.DiskBytes}
}

// AdmitSandbox checks a new sandbox of project using want against the
// quota of the project and of every ancestor; usage(path) is what path and
// its subprojects use now. The caller holds its creates' lock across
// AdmitSandbox and recording the sandbox, so the check is atomic with the
// create. Project "" (the node administrator's own) has no quota.
func (s *Service) AdmitSandbox(ctx context.Context, project string, want Usage, usage func(path string) Usage) error {
	paths, quotas, err := s.QuotaChain(ctx, project)
	if err != nil {
		return err
	}
	for i, path := range paths {
		if err := CheckUsage(path, quotas[i], usage(path), want); err != nil {
			return err
		}
	}
	return s.take(paths, quotas, "creates_per_sec", func(q Quota) float64 { return q.CreatesPerSec }, 1)
}

// QuotaChain returns project and every ancestor (project first) with
// their quotas. Project "" has none.
func (s *Service) QuotaChain(ctx context.Context, project string) ([]string, []Quota, error) {
	paths := Ancestors(project)
	quotas := make([]Quota, len(paths))
	for i, path := range paths {
		proj, _, err := s.getProject(ctx, path)
		if errdefs.IsNotFound(err) {
			return nil, nil, errdefs.NotFound("project %s: not found (deleted?)", path)
		}
		if err != nil {
			return nil, nil, err
		}
		quotas[i] = proj.Quota
	}
	return paths, quotas, nil
}

// CheckUsage refuses a sandbox using want when project path, with q, already
// uses used: ResourceExhausted naming the project, quota, limit and use.
func CheckUsage(path string, q Quota, used, want Usage) error {
	checks := []struct {
		name              string
		limit, used, want int64
	}{
		{"max_sandboxes", q.MaxSandboxes, used.Sandboxes, 1},
		{"cpu_millis", q.CPUMillis, used.CPUMillis, want.CPUMillis},
		{"memory_bytes", q.MemoryBytes, used.MemoryBytes, want.MemoryBytes},
		{"disk_bytes", q.DiskBytes, used.DiskBytes, want.DiskBytes},
	}
	for _, c := range checks {
		if c.limit > 0 && c.used+c.want > c.limit {
			return errdefs.ResourceExhausted("project %s: quota %s: limit %d, in use %d, this sandbox asks %d",
				path, c.name, c.limit, c.used, c.want)
		}
	}
	return nil
}

// Limits reports whether q bounds any concurrent resource (not rates).
func (q Quota) Limits() bool {
	return q.MaxSandboxes > 0 || q.CPUMillis > 0 || q.MemoryBytes > 0 || q.DiskBytes > 0
}

// AdmitCalls takes n fncall calls from the calls_per_sec buckets of
// project and its ancestors.
func (s *Service) AdmitCalls(ctx context.Context, project string, n int) error {
	paths := Ancestors(project)
	quotas := make([]Quota, len(paths))
	for i, path := range paths {
		proj, _, err := s.getProject(ctx, path)
		if err != nil {
			return err
		}
		quotas[i] = proj.Quota
	}
	return s.take(paths, quotas, "calls_per_sec", func(q Quota) float64 { return q.CallsPerSec }, float64(n))
}

// bucket is a token bucket refilled at rate per second, holding at most
// one second's worth (and at least one).
type bucket struct {
	tokens float64
	last   float64 // seconds, from s.now
}

// take takes n from the bucket of every limited path, or none at all.
func (s *Service) take(paths []string, quotas []Quota, name string, rate func(Quota) float64, n float64) error {
	now := float64(s.now().UnixNano()) / 1e9
	s.rateMu.Lock()
	defer s.rateMu.Unlock()
	var taken []*bucket
	for i, path := range paths {
		r := rate(quotas[i])
		if r <= 0 {
			continue
		}
		key := name + "\x00" + path
		b := s.buckets[key]
		capacity := math.Max(1, r)
		if b == nil {
			b = &bucket{tokens: capacity, last: now}
			s.buckets[key] = b
		}
		b.tokens = math.Min(capacity, b.tokens+(now-b.last)*r)
		b.last = now
		if b.tokens < n {
			for _, t := range taken {
				t.tokens += n
			}
			return errdefs.ResourceExhausted("project %s: quota %s: limit %g/s, exceeded (%s asks %g, %.2f left now)",
				path, name, r, fmt.Sprint(paths[0]), n, b.tokens)
		}
		b.tokens -= n
		taken = append(taken, b)
	}
	return nil
}
