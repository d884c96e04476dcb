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

// Sweep removes, with cleanup, every sandbox of runDir that keep does not
// know: those with a VMM process in procs (see Processes), a run dir or a
// VMM cgroup in groups.
func Sweep(ctx context.Context, log *slog.Logger, runDir string, procs map[string][]int, groups *CPUGroups, keep func(id string) bool, cleanup func(ctx context.Context, id string) error) error {
	ids := map[string]bool{}
	for id, pids := range procs {
		if !keep(id) {
			log.Info("killing VMM that outlived its sandbox record", "sandbox", id, "pids", pids)
			ids[id] = true
		}
	}
	ents, err := os.ReadDir(runDir)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("sweep: %w", err)
	}
	for _, e := range ents {
		if backend.CheckID(e.Name()) == nil && !keep(e.Name()) {
			ids[e.Name()] = true
		}
	}
	cgs, err := groups.List()
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
		log.Info("sweeping leftover sandbox", "sandbox", id)
		errs = append(errs, cleanup(ctx, id))
	}
	return errors.Join(errs...)
}

// Remove is the end of a VM's Cleanup: the VMM recorded as pid (0: none;
// checked by its start time against pid reuse) is killed and waited for,
// then VMMs of the sandbox whose record was never written (leftovers,
// found by command line), then the network slot rec (nil: none; the veth
// goes with the namespace once QEMU is gone, Remove covers a namespace
// something else still held), the VMM's cgroup in groups and the run dir
// with everything in it.
func Remove(ctx context.Context, id, dir string, pid int, start uint64, leftovers []int, mgr *netpolicy.Manager, rec *netpolicy.Record, groups *CPUGroups) error {
	if pid > 0 {
		if proc, err := launch.Attach(pid, start); err == nil {
			_ = proc.Kill()
			select {
			case <-proc.Done():
			case <-ctx.Done():
			}
			proc.Release()
		}
	}
	for _, p := range leftovers {
		_ = unix.Kill(p, unix.SIGKILL)
	}
	if rec != nil && mgr != nil {
		if err := mgr.Remove(*rec); err != nil {
			return fmt.Errorf("sandbox %s: cleanup: %w", id, err)
		}
	}
	if err := groups.Remove(ctx, id); err != nil {
		return fmt.Errorf("sandbox %s: cleanup: %w", id, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("sandbox %s: cleanup: %w", id, err)
	}
	return nil
}

// Leftovers names what of sandbox id is still on the host: a VMM process
// in procs (see Processes), its cgroup in groups, its run dir under
// runDir. After a Remove it is empty.
func Leftovers(runDir, id string, procs map[string][]int, groups *CPUGroups) ([]string, error) {
	var out []string
	for _, pid := range procs[id] {
		out = append(out, "VMM process "+strconv.Itoa(pid))
	}
	ids, err := groups.List()
	if err != nil {
		return nil, fmt.Errorf("leftovers of %s: %w", id, err)
	}
	if slices.Contains(ids, id) {
		out = append(out, "VMM cgroup")
	}
	if _, err := os.Lstat(filepath.Join(runDir, id)); !os.IsNotExist(err) {
		out = append(out, "run dir")
	}
	return out, nil
}
