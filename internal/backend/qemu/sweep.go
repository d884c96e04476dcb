package qemu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/procfs"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// Processes finds the VMM processes started for sandboxes under runDir,
// by sandbox id: their command lines name a file in <runDir>/<id>/, and
// isVMM accepts their argv[0].
func Processes(runDir string, isVMM func(argv0 string) bool) map[string][]int {
	out := map[string][]int{}
	prefix := filepath.Clean(runDir) + "/"
	for pid, args := range procfs.Cmdlines() {
		if !isVMM(args[0]) {
			continue
		}
		for _, a := range args {
			i := strings.Index(a, prefix)
			if i < 0 {
				continue
			}
			id, _, _ := strings.Cut(a[i+len(prefix):], "/")
			if backend.CheckID(id) == nil {
				out[id] = append(out[id], pid)
				break
			}
		}
	}
	return out
}

// IsQEMU accepts a QEMU system emulator's argv[0].
func IsQEMU(argv0 string) bool { return strings.HasPrefix(filepath.Base(argv0), "qemu-system") }

// RunDir is where one backend's VM sandboxes live on this host: each has
// a run dir <Path>/<id> holding its MachineFile (a record embedding
// VMM), a VMM process, a CPU cgroup in Groups and, when networked, a slot
// of Network. Cleanup and Sweep find each part from the record or, where
// none was written, from what the host holds.
type RunDir struct {
	Path string
	// IsVMM accepts the argv[0] of the backend's VMM processes.
	IsVMM   func(argv0 string) bool
	Network *netpolicy.Manager // nil: the node runs VMs without network
	Groups  *CPUGroups
	Log     *slog.Logger
}

// Dir is sandbox id's run dir.
func (r *RunDir) Dir(id string) string { return filepath.Join(r.Path, id) }

// Load decodes sandbox id's record (MachineFile) into record, which
// embeds VMM; a sandbox without one is NotFound.
func (r *RunDir) Load(id string, record any) error {
	if err := backend.CheckID(id); err != nil {
		return err
	}
	if err := LoadMachine(r.Dir(id), record); err != nil {
		return errdefs.NotFound("sandbox %s: no vm state: %v", id, err)
	}
	return nil
}

// Processes finds the backend's VMM processes by sandbox id (see
// Processes).
func (r *RunDir) Processes() map[string][]int { return Processes(r.Path, r.IsVMM) }

// Cleanup removes sandbox id from the host: the VMM its record names is
// killed (checked by start time against pid reuse) and waited for, then
// VMMs of the sandbox whose record was never written (found by command
// line), then its network slot (the veth goes with the namespace once
// the VMM is gone; this covers a namespace something else still held),
// its cgroup and its run dir with everything in it.
func (r *RunDir) Cleanup(ctx context.Context, id string) error {
	if err := backend.CheckID(id); err != nil {
		return err
	}
	dir := r.Dir(id)
	var v VMM
	_ = LoadMachine(dir, &v) // none: nothing but what the host holds to go by
	if pid, start := v.Live(); pid > 0 {
		if proc, err := launch.Attach(pid, start); err == nil {
			_ = proc.Kill()
			select {
			case <-proc.Done():
			case <-ctx.Done():
			}
			proc.Release()
		}
	}
	for _, p := range r.Processes()[id] {
		_ = unix.Kill(p, unix.SIGKILL)
	}
	if v.Net != nil && r.Network != nil {
		if err := r.Network.Remove(*v.Net); err != nil {
			return fmt.Errorf("sandbox %s: cleanup: %w", id, err)
		}
	}
	if err := r.Groups.Remove(ctx, id); err != nil {
		return fmt.Errorf("sandbox %s: cleanup: %w", id, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("sandbox %s: cleanup: %w", id, err)
	}
	return nil
}

// Sweep cleans up every sandbox that keep does not know: those with a
// VMM process, a run dir or a VMM cgroup.
func (r *RunDir) Sweep(ctx context.Context, keep func(id string) bool) error {
	ids := map[string]bool{}
	for id, pids := range r.Processes() {
		if !keep(id) {
			r.Log.Info("killing VMM that outlived its sandbox record", "sandbox", id, "pids", pids)
			ids[id] = true
		}
	}
	ents, err := os.ReadDir(r.Path)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("sweep: %w", err)
	}
	for _, e := range ents {
		if backend.CheckID(e.Name()) == nil && !keep(e.Name()) {
			ids[e.Name()] = true
		}
	}
	cgs, err := r.Groups.List()
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	for _, id := range cgs {
		if backend.CheckID(id) == nil && !keep(id) {
			ids[id] = true
		}
	}
	var errs []error
	for id := range ids {
		r.Log.Info("sweeping leftover sandbox", "sandbox", id)
		errs = append(errs, r.Cleanup(ctx, id))
	}
	return errors.Join(errs...)
}

// Leftovers names what of sandbox id is still on the host: a VMM
// process, its cgroup, its run dir. After a Cleanup it is empty.
func (r *RunDir) Leftovers(id string) ([]string, error) {
	var out []string
	for _, pid := range r.Processes()[id] {
		out = append(out, "VMM process "+strconv.Itoa(pid))
	}
	ids, err := r.Groups.List()
	if err != nil {
		return nil, fmt.Errorf("leftovers of %s: %w", id, err)
	}
	if slices.Contains(ids, id) {
		out = append(out, "VMM cgroup")
	}
	if _, err := os.Lstat(r.Dir(id)); !os.IsNotExist(err) {
		out = append(out, "run dir")
	}
	return out, nil
}
