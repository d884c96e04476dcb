package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/runtime/launch"
	"github.com/corral-dev/corral/internal/runtime/userns"
	"github.com/corral-dev/corral/internal/safefs"
	"golang.org/x/sys/unix"
)

// sandbox implements backend.Sandbox.
type sandbox struct {
	*safefs.FS
	b      *Backend
	id     string
	group  *cgroup.Group
	proc   *launch.Process
	client launch.Client
	ids    userns.Range       // the host ids of the sandbox's user namespace
	pool   *poolState         // resettable sandboxes only; the view is /v of init's root
	net    *netpolicy.Sandbox // nil for network mode none

	stopMu  sync.Mutex
	stopped bool
}

var _ backend.Sandbox = (*sandbox)(nil)

func (b *Backend) newSandbox(id string, g *cgroup.Group, proc *launch.Process, net *netpolicy.Sandbox, ids userns.Range) *sandbox {
	s := &sandbox{b: b, id: id, group: g, proc: proc, client: launch.NewClient(b.sockPath(id)), net: net, ids: ids}
	s.FS = safefs.New(s.openRoot)
	return s
}

// WriteFile implements backend.Files as the sandbox's root: a new file
// belongs to it (host root has no id on the sandbox's idmapped layers).
func (s *sandbox) WriteFile(ctx context.Context, p string, r io.Reader, opts backend.WriteOptions) (int64, error) {
	var n int64
	err := userns.AsRoot(s.ids, func() (err error) {
		n, err = s.FS.WriteFile(ctx, p, r, opts)
		return err
	})
	return n, err
}

// Stat implements backend.Files with owners as the sandbox sees them.
func (s *sandbox) Stat(ctx context.Context, p string) (backend.FileInfo, error) {
	fi, err := s.FS.Stat(ctx, p)
	if err == nil {
		fi.UID, fi.GID = s.ids.Inside(fi.UID), s.ids.Inside(fi.GID)
	}
	return fi, err
}

// ListDir implements backend.Files with owners as the sandbox sees them.
func (s *sandbox) ListDir(ctx context.Context, p string) ([]backend.FileInfo, error) {
	list, err := s.FS.ListDir(ctx, p)
	for i := range list {
		list[i].UID, list[i].GID = s.ids.Inside(list[i].UID), s.ids.Inside(list[i].GID)
	}
	return list, err
}

// MakeDir implements backend.Files as the sandbox's root (see WriteFile).
func (s *sandbox) MakeDir(ctx context.Context, p string, mode fs.FileMode, parents bool) error {
	return userns.AsRoot(s.ids, func() error { return s.FS.MakeDir(ctx, p, mode, parents) })
}

// rootPath is the sandbox's root as init sees it: its own, or a pooled
// sandbox's view (re-opened every time: a reset replaces the mount).
func (s *sandbox) rootPath() string {
	path := fmt.Sprintf("/proc/%d/root", s.proc.Pid)
	if s.pool != nil {
		path += "/v"
	}
	return path
}

// openRoot opens the sandbox's root. The liveness check after the open
// makes sure the pid was not reused by another process.
func (s *sandbox) openRoot() (*os.File, error) {
	f, err := os.OpenFile(s.rootPath(), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if !s.proc.Alive() {
		f.Close()
		return nil, fmt.Errorf("sandbox %s: %w", s.id, os.ErrNotExist)
	}
	return f, nil
}

func (s *sandbox) ID() string { return s.id }

// Record implements backend.Sandbox; it changes with UpdateNetwork.
func (s *sandbox) Record() []byte {
	r := record{Pid: s.proc.Pid, StartTime: s.proc.StartTime, IDs: s.ids, InitServes: s.client.ReusesConns()}
	if s.pool != nil && s.pool.view {
		r.View = &viewRecord{Layers: s.pool.spec.Layers, Resources: s.pool.spec.Resources}
	}
	if s.net != nil {
		nr := s.net.Record()
		r.Net = &nr
	}
	b, _ := json.Marshal(r)
	return b
}
func (s *sandbox) Done() <-chan struct{}            { return s.proc.Done() }
func (s *sandbox) Pause(ctx context.Context) error  { return s.freezer(ctx, "pause", s.group.Freeze) }
func (s *sandbox) Resume(ctx context.Context) error { return s.freezer(ctx, "resume", s.group.Thaw) }

// freezer runs a freeze or thaw of a live sandbox's cgroup.
func (s *sandbox) freezer(ctx context.Context, what string, op func(context.Context) error) error {
	if err := s.live(); err != nil {
		return err
	}
	if err := op(ctx); err != nil {
		return fmt.Errorf("sandbox %s: %s: %w", s.id, what, err)
	}
	return nil
}

func (s *sandbox) live() error {
	select {
	case <-s.proc.Done():
		return errdefs.FailedPrecondition("sandbox %s: not running", s.id)
	default:
		return nil
	}
}

// Stop implements backend.Sandbox: SIGKILL to init ends the PID namespace,
// then the cgroups are emptied and removed. The mount namespace and its
// overlay go with the last process.
func (s *sandbox) Stop(ctx context.Context) error {
	s.stopMu.Lock()
	defer s.stopMu.Unlock()
	if s.stopped {
		return nil
	}
	if !s.proc.Alive() {
		// Init ends only by the node's kill: its own end is a fault whose
		// trace (a Go panic, say) is in init.log, removed with the sandbox.
		s.b.log.Warn("sandbox init had exited before the stop", "sandbox", s.id, "init_log", s.initLogTail())
	}
	start := time.Now()
	errs := []error{s.proc.Kill(), s.group.Kill(ctx)}
	killed := time.Since(start)
	select {
	case <-s.proc.Done():
	case <-ctx.Done():
		return fmt.Errorf("sandbox %s: stop: %w", s.id, ctx.Err())
	}
	exited := time.Since(start)
	s.client.Close()
	s.stopPool()
	errs = append(errs, s.group.Remove(ctx))
	s.b.log.Debug("sandbox stopped", "sandbox", s.id, "kill", killed, "exit", exited-killed, "cgroup", time.Since(start)-exited)
	if s.net != nil {
		errs = append(errs, s.net.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox %s: stop: %w", s.id, err)
	}
	s.proc.Release()
	s.stopped = true
	return nil
}

// initLogTail is the end of init's own log, for a warning.
func (s *sandbox) initLogTail() string {
	const tail = 2048
	f, err := os.Open(filepath.Join(s.b.runDir(s.id), "init.log"))
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > tail {
		_, _ = f.Seek(fi.Size()-tail, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, tail))
	return string(b)
}

var _ backend.Networker = (*sandbox)(nil)

// UpdateNetwork implements backend.Networker.
func (s *sandbox) UpdateNetwork(ctx context.Context, n backend.Network) error {
	if s.net == nil {
		return errdefs.FailedPrecondition("sandbox %s: created with network mode none: it has no interface to open (create it with mode allowlist, even with no rules, to change its network later)", s.id)
	}
	if err := s.live(); err != nil {
		return err
	}
	mode, err := netpolicy.ParseMode(n.Mode)
	if err != nil {
		return err
	}
	if err := s.net.Update(ctx, netpolicy.Policy{Mode: mode, Allow: n.Allow}); err != nil {
		return fmt.Errorf("sandbox %s: %w", s.id, err)
	}
	return nil
}

// NetworkStats implements backend.Networker.
func (s *sandbox) NetworkStats(ctx context.Context) (backend.NetworkStats, error) {
	if s.net == nil {
		return backend.NetworkStats{}, nil
	}
	out, err := s.net.NetworkStats()
	if err != nil {
		return backend.NetworkStats{}, fmt.Errorf("sandbox %s: %w", s.id, err)
	}
	return out, nil
}
