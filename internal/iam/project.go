package iam

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Quota bounds a project and everything beneath it. A zero field is no
// limit of the project's own: its use still counts against every ancestor.
type Quota struct {
	MaxSandboxes  int64   `json:"max_sandboxes,omitempty"`
	CPUMillis     int64   `json:"cpu_millis,omitempty"`
	MemoryBytes   int64   `json:"memory_bytes,omitempty"`
	DiskBytes     int64   `json:"disk_bytes,omitempty"`
	CreatesPerSec float64 `json:"creates_per_sec,omitempty"`
	CallsPerSec   float64 `json:"calls_per_sec,omitempty"`
}

// quotaFields lists a Quota's fields by their names in errors and on the
// CLI, so checks over every field are one loop.
var quotaFields = []struct {
	name string
	get  func(*Quota) float64
	set  func(*Quota, float64)
}{
	{"max_sandboxes", func(q *Quota) float64 { return float64(q.MaxSandboxes) }, func(q *Quota, v float64) { q.MaxSandboxes = int64(v) }},
	{"cpu_millis", func(q *Quota) float64 { return float64(q.CPUMillis) }, func(q *Quota, v float64) { q.CPUMillis = int64(v) }},
	{"memory_bytes", func(q *Quota) float64 { return float64(q.MemoryBytes) }, func(q *Quota, v float64) { q.MemoryBytes = int64(v) }},
	{"disk_bytes", func(q *Quota) float64 { return float64(q.DiskBytes) }, func(q *Quota, v float64) { q.DiskBytes = int64(v) }},
	{"creates_per_sec", func(q *Quota) float64 { return q.CreatesPerSec }, func(q *Quota, v float64) { q.CreatesPerSec = v }},
	{"calls_per_sec", func(q *Quota) float64 { return q.CallsPerSec }, func(q *Quota, v float64) { q.CallsPerSec = v }},
}

func (q Quota) validate() error {
	for _, f := range quotaFields {
		if v := f.get(&q); v < 0 {
			return errdefs.InvalidArgument("quota.%s: %g must not be negative (0 is no limit of its own)", f.name, v)
		}
	}
	return nil
}

// Project is one node of the project tree.
type Project struct {
	Path  string `json:"path"`
	Quota Quota  `json:"quota"`
	// Delegated is the sum of the direct children's quotas, per field.
	Delegated Quota     `json:"delegated"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"`
}

const (
	maxProjectDepth = 8
	maxProjectPath  = 200
)

var projectSegment = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidateProject checks a project path: slash-separated segments of
// lower-case letters, digits, '.', '_' and '-'.
func ValidateProject(path string) error {
	if path == "" {
		return errdefs.InvalidArgument("project: required")
	}
	if len(path) > maxProjectPath {
		return errdefs.InvalidArgument("project: %d characters is longer than %d", len(path), maxProjectPath)
	}
	segs := strings.Split(path, "/")
	if len(segs) > maxProjectDepth {
		return errdefs.InvalidArgument("project %s: %d levels is deeper than %d", path, len(segs), maxProjectDepth)
	}
	for _, s := range segs {
		if !projectSegment.MatchString(s) {
			return errdefs.InvalidArgument("project %q: segment %q must be 1-63 of a-z 0-9 . _ - (starting with a letter or digit)", path, s)
		}
	}
	return nil
}

func projectKey(path string) string { return "projects/" + path }

func (s *Service) getProject(ctx context.Context, path string) (*Project, int64, error) {
	v, rev, err := s.store.Get(ctx, projectKey(path))
	if errdefs.IsNotFound(err) {
		return nil, 0, errdefs.NotFound("project %s: not found", path)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("project %s: %w", path, err)
	}
	p := new(Project)
	if err := json.Unmarshal(v, p); err != nil {
		return nil, 0, fmt.Errorf("project %s: decode: %w", path, err)
	}
	return p, rev, nil
}

// mayManageChild says whether p may create, change or delete project path:
// the node administrator, or an admin of path's parent project.
func (s *Service) mayManageChild(p Principal, path string) error {
	parent := parentOf(path)
	if p.NodeAdmin {
		return nil
	}
	if parent == "" || !p.Administers(parent) {
		if p.Sees(path) || p.Sees(parent) {
			return errdefs.PermissionDenied("project %s: %s may not manage it (needs the admin role in %s)", path, p, or(parent, "the node"))
		}
		return errdefs.NotFound("project %s: not found", path)
	}
	return nil
}

// checkQuotaChange checks a request to give project path quota q: a valid
// path and quota, asked by someone who may manage path.
func (s *Service) checkQuotaChange(p Principal, path string, q Quota) error {
	if err := ValidateProject(path); err != nil {
		return err
	}
	if err := q.validate(); err != nil {
		return err
	}
	return s.mayManageChild(p, path)
}

// CreateProject makes project path with quota q, which the parent gives
// out of what it has not yet delegated to its other children.
func (s *Service) CreateProject(ctx context.Context, p Principal, path string, q Quota) (*Project, error) {
	if err := s.checkQuotaChange(p, path, q); err != nil {
		return nil, err
	}
	proj := &Project{Path: path, Quota: q, CreatedAt: s.now().UTC(), CreatedBy: p.String()}
	val, _ := json.Marshal(proj)
	for attempt := 0; ; attempt++ {
		conds := []Cond{{Key: projectKey(path), Rev: 0}}
		writes := []Write{{Key: projectKey(path), Value: val}}
		if parent := parentOf(path); parent != "" {
			pp, prev, err := s.getProject(ctx, parent)
			if err != nil {
				return nil, err
			}
			if err := delegate(pp, Quota{}, q, path); err != nil {
				return nil, err
			}
			pv, _ := json.Marshal(pp)
			conds = append(conds, Cond{Key: projectKey(parent), Rev: prev})
			writes = append(writes, Write{Key: projectKey(parent), Value: pv})
		}
		err := s.store.Txn(ctx, conds, writes)
		if err == nil {
			return proj, nil
		}
		if !errdefs.IsFailedPrecondition(err) || attempt > 20 {
			return nil, fmt.Errorf("create project %s: %w", path, err)
		}
		if _, _, gerr := s.store.Get(ctx, projectKey(path)); gerr == nil {
			return nil, errdefs.AlreadyExists("project %s: already exists", path)
		}
	}
}

// delegate moves parent's delegated amounts from old to new for child,
// failing when a limited field of parent has less left than new asks.
func delegate(parent *Project, old, new Quota, child string) error {
	for _, f := range quotaFields {
		limit := f.get(&parent.Quota)
		given := f.get(&parent.Delegated) - f.get(&old) + f.get(&new)
		if limit > 0 && f.get(&new) > 0 && given > limit {
			left := limit - (f.get(&parent.Delegated) - f.get(&old))
			return errdefs.ResourceExhausted("project %s: quota %s: %s asks %g but %s has %g left (limit %g, %g given to other subprojects)",
				parent.Path, f.name, child, f.get(&new), parent.Path, left, limit, limit-left)
		}
		f.set(&parent.Delegated, given)
	}
	return nil
}

// SetQuota changes the quota of project path (not of the caller's own
// project: that is its parent's to give).
func (s *Service) SetQuota(ctx context.Context, p Principal, path string, q Quota) (*Project, error) {
	if err := s.checkQuotaChange(p, path, q); err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		proj, rev, err := s.getProject(ctx, path)
		if err != nil {
			return nil, err
		}
		for _, f := range quotaFields {
			if v := f.get(&q); v > 0 && v < f.get(&proj.Delegated) {
				return nil, errdefs.FailedPrecondition("project %s: quota %s: %g is less than the %g already given to its subprojects", path, f.name, v, f.get(&proj.Delegated))
			}
		}
		old := proj.Quota
		proj.Quota = q
		val, _ := json.Marshal(proj)
		conds := []Cond{{Key: projectKey(path), Rev: rev}}
		writes := []Write{{Key: projectKey(path), Value: val}}
		if parent := parentOf(path); parent != "" {
			pp, prev, err := s.getProject(ctx, parent)
			if err != nil {
				return nil, err
			}
			if err := delegate(pp, old, q, path); err != nil {
				return nil, err
			}
			pv, _ := json.Marshal(pp)
			conds = append(conds, Cond{Key: projectKey(parent), Rev: prev})
			writes = append(writes, Write{Key: projectKey(parent), Value: pv})
		}
		err = s.store.Txn(ctx, conds, writes)
		if err == nil {
			return proj, nil
		}
		if !errdefs.IsFailedPrecondition(err) || attempt > 20 {
			return nil, fmt.Errorf("set quota of project %s: %w", path, err)
		}
	}
}

// GetProject returns project path if p sees it.
func (s *Service) GetProject(ctx context.Context, p Principal, path string) (*Project, error) {
	if err := ValidateProject(path); err != nil {
		return nil, err
	}
	if !p.Sees(path) {
		return nil, errdefs.NotFound("project %s: not found", path)
	}
	proj, _, err := s.getProject(ctx, path)
	return proj, err
}

// ListProjects returns the projects p sees, in path order.
func (s *Service) ListProjects(ctx context.Context, p Principal) ([]*Project, error) {
	prefix := "projects/"
	if !p.NodeAdmin {
		prefix = projectKey(p.Project)
	}
	return listRecords(ctx, s.store, prefix, func(proj *Project) bool { return p.Sees(proj.Path) })
}

// listRecords decodes the JSON records under prefix, in key order, and
// returns those keep accepts.
func listRecords[T any](ctx context.Context, store Store, prefix string, keep func(*T) bool) ([]*T, error) {
	entries, err := store.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var out []*T
	for _, e := range entries {
		v := new(T)
		if err := json.Unmarshal(e.Value, v); err != nil {
			return nil, fmt.Errorf("decode %s: %w", e.Key, err)
		}
		if keep(v) {
			out = append(out, v)
		}
	}
	return out, nil
}

// Contents is what lives in projects besides their IAM records: the node's
// sandboxes (and, through the server, images). DeleteProject empties a
// project through it.
type Contents interface {
	// Count says how many things project holds (its own, not its
	// subprojects'), as a phrase for errors ("3 sandboxes"); "" when none.
	Count(ctx context.Context, project string) (string, error)
	// DeleteAll deletes everything project holds.
	DeleteAll(ctx context.Context, project string) error
}

// DeleteProject deletes project path, its subprojects and their tokens.
// What they hold is deleted first; with keep, a project holding anything
// is refused instead.
func (s *Service) DeleteProject(ctx context.Context, p Principal, path string, keep bool) error {
	if err := ValidateProject(path); err != nil {
		return err
	}
	if err := s.mayManageChild(p, path); err != nil {
		return err
	}
	proj, _, err := s.getProject(ctx, path)
	if err != nil {
		return err
	}
	subtree, err := s.store.List(ctx, projectKey(path)+"/")
	if err != nil {
		return err
	}
	paths := []string{path}
	for _, e := range subtree {
		paths = append(paths, strings.TrimPrefix(e.Key, "projects/"))
	}
	if keep && len(paths) > 1 {
		return errdefs.FailedPrecondition("project %s: has subprojects (%s…); delete them or drop --keep", path, paths[1])
	}
	if s.contents != nil {
		for _, pp := range paths {
			what, err := s.contents.Count(ctx, pp)
			if err != nil {
				return err
			}
			if what == "" {
				continue
			}
			if keep {
				return errdefs.FailedPrecondition("project %s: still holds %s; delete them or drop --keep", pp, what)
			}
		}
		// Deepest first, so no subproject outlives its parent's contents.
		for i := len(paths) - 1; i >= 0; i-- {
			if err := s.contents.DeleteAll(ctx, paths[i]); err != nil {
				return fmt.Errorf("delete project %s: %w", paths[i], err)
			}
		}
	}
	tokens, err := s.store.List(ctx, "tokens/")
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		var conds []Cond
		var writes []Write
		for _, e := range subtree {
			writes = append(writes, Write{Key: e.Key, Delete: true})
		}
		_, rev, err := s.getProject(ctx, path)
		if err != nil {
			return err
		}
		conds = append(conds, Cond{Key: projectKey(path), Rev: rev})
		writes = append(writes, Write{Key: projectKey(path), Delete: true})
		for _, e := range tokens {
			var t Token
			if json.Unmarshal(e.Value, &t) == nil && Within(t.Project, path) {
				writes = append(writes, Write{Key: e.Key, Delete: true})
			}
		}
		if parent := parentOf(path); parent != "" {
			pp, prev, err := s.getProject(ctx, parent)
			if err == nil {
				_ = delegate(pp, proj.Quota, Quota{}, path) // giving back never fails
				pv, _ := json.Marshal(pp)
				conds = append(conds, Cond{Key: projectKey(parent), Rev: prev})
				writes = append(writes, Write{Key: projectKey(parent), Value: pv})
			}
		}
		err = s.store.Txn(ctx, conds, writes)
		if err == nil {
			break
		}
		if !errdefs.IsFailedPrecondition(err) || attempt > 20 {
			return fmt.Errorf("delete project %s: %w", path, err)
		}
	}
	// A create admitted before the records went may have finished since
	// the first sweep; none is admitted now that the project is gone.
	if s.contents != nil {
		for i := len(paths) - 1; i >= 0; i-- {
			if err := s.contents.DeleteAll(ctx, paths[i]); err != nil {
				return fmt.Errorf("delete project %s: second sweep: %w", paths[i], err)
			}
		}
	}
	return nil
}

func or(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}
