package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Limits are the resource limits of one sandbox; zero means unlimited.
type Limits struct {
	MemoryBytes int64
	CPUMillis   int64 // 1000 = one core
	Pids        int64
}

const cpuPeriodUS = 100000

// Group is one sandbox's cgroup in every hierarchy.
type Group struct {
	id      string
	v1      map[string]string // controller -> directory
	roots   map[string]string // controller -> its hierarchy's mount point
	v2      string            // v2 directory ("" when no v2 tree)
	unified bool              // limits live in v2
}

// V2Path is the directory in the cgroup2 tree ("" when the host has none).
// cgroup-BPF programs attach there.
func (g *Group) V2Path() string { return g.v2 }

// Create makes the directories and writes the limits. On error the caller
// should Remove the group.
func (m *Manager) Create(id string, lim Limits) (*Group, error) {
	if err := m.ensureParent(); err != nil {
		return nil, err
	}
	g := m.Group(id)
	for _, d := range g.allDirs() {
		if err := os.Mkdir(d, 0o755); err != nil {
			return g, fmt.Errorf("cgroup %s: %w", id, err)
		}
	}
	if err := g.setLimits(lim); err != nil {
		return g, fmt.Errorf("cgroup %s: %w", id, err)
	}
	return g, nil
}

func (g *Group) allDirs() []string {
	var out []string
	for _, d := range distinctV1(g.v1) {
		out = append(out, d)
	}
	if g.v2 != "" {
		out = append(out, g.v2)
	}
	return out
}

func write(dir, file, val string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(val), 0); err != nil {
		return fmt.Errorf("write %s: %w", file, err)
	}
	return nil
}

func (g *Group) setLimits(lim Limits) error {
	if g.unified {
		return g.setLimitsV2(lim)
	}
	if lim.MemoryBytes > 0 {
		d := g.v1["memory"]
		if err := write(d, "memory.limit_in_bytes", strconv.FormatInt(lim.MemoryBytes, 10)); err != nil {
			return err
		}
		// memsw exists only with swap accounting; limit mem+swap to the same
		// value so nothing is swapped out beyond the limit.
		if _, err := os.Stat(filepath.Join(d, "memory.memsw.limit_in_bytes")); err == nil {
			if err := write(d, "memory.memsw.limit_in_bytes", strconv.FormatInt(lim.MemoryBytes, 10)); err != nil {
				return err
			}
		}
	}
	if lim.CPUMillis > 0 && g.v1["cpu"] != "" {
		if err := g.SetCPU(lim.CPUMillis); err != nil {
			return err
		}
	}
	if lim.Pids > 0 && g.v1["pids"] != "" {
		if err := write(g.v1["pids"], "pids.max", strconv.FormatInt(lim.Pids, 10)); err != nil {
			return err
		}
	}
	return nil
}

func (g *Group) setLimitsV2(lim Limits) error {
	if lim.MemoryBytes > 0 {
		if err := write(g.v2, "memory.max", strconv.FormatInt(lim.MemoryBytes, 10)); err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(g.v2, "memory.swap.max")); err == nil {
			if err := write(g.v2, "memory.swap.max", "0"); err != nil {
				return err
			}
		}
	}
	if lim.CPUMillis > 0 {
		if err := g.SetCPU(lim.CPUMillis); err != nil {
			return err
		}
	}
	if lim.Pids > 0 {
		if err := write(g.v2, "pids.max", strconv.FormatInt(lim.Pids, 10)); err != nil {
			return err
		}
	}
	return nil
}

// EnterThread moves the calling OS thread into every v1 hierarchy of the
// group. The caller runs on a thread that Go discards afterwards and that
// is never the thread group leader (osthread), so no other goroutine ever
// runs in the group, and a failure halfway needs no undoing. The v2 tree is
// joined at clone time with OpenV2 and CLONE_INTO_CGROUP (v2 does not place
// single threads).
func (g *Group) EnterThread() error {
	tid := strconv.Itoa(unix.Gettid())
	for c, d := range distinctV1(g.v1) {
		if err := write(d, "tasks", tid); err != nil {
			return fmt.Errorf("cgroup %s: enter %s: %w", g.id, c, err)
		}
	}
	return nil
}

// OpenTasks opens the tasks file of each of the group's v1 hierarchies for
// writing, for a process that moves one of its own threads in (the
// spawner, which gets them with a request); the caller closes them.
func (g *Group) OpenTasks() ([]*os.File, error) {
	var files []*os.File
	for c, d := range distinctV1(g.v1) {
		f, err := os.OpenFile(filepath.Join(d, "tasks"), os.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, fmt.Errorf("cgroup %s: open %s tasks: %w", g.id, c, err)
		}
		files = append(files, f)
	}
	return files, nil
}

// readCgroups reads a /proc cgroup file: each v1 controller ("" for v2)
// to its cgroup path.
func readCgroups(file string) (map[string]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, nil
}

// OpenV2 opens the v2 directory for CLONE_INTO_CGROUP; nil when there is no
// v2 tree.
func (g *Group) OpenV2() (*os.File, error) {
	if g.v2 == "" {
		return nil, nil
	}
	f, err := os.OpenFile(g.v2, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: open v2 dir: %w", g.id, err)
	}
	return f, nil
}

// Exists reports whether any directory of the group exists.
func (g *Group) Exists() bool {
	for _, d := range g.allDirs() {
		if _, err := os.Stat(d); err == nil {
			return true
		}
	}
	return false
}

// oomFile is the group's file with its OOM kill counter: v1
// memory.oom_control, v2 memory.events.
func (g *Group) oomFile() string {
	if g.unified {
		return filepath.Join(g.v2, "memory.events")
	}
	return filepath.Join(g.v1["memory"], "memory.oom_control")
}

// OOMKills returns the number of OOM kills in the group so far.
func (g *Group) OOMKills() (uint64, error) {
	v, err := readKey(g.oomFile(), "oom_kill")
	if err != nil {
		return 0, fmt.Errorf("cgroup %s: oom counter: %w", g.id, err)
	}
	return v, nil
}

// readKey reads one "key value" line of a small cgroup file.
func readKey(file, key string) (uint64, error) {
	b, err := readSmall(file)
	if err != nil {
		return 0, err
	}
	v, err := keyValue(b, key)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", file, err)
	}
	return v, nil
}

// readSmall reads a small cgroup file whole. It reads with plain syscalls:
// os.Open would register the file with Go's poller (kernfs files are
// pollable) and unregister it again, and an exec reads the OOM counter
// twice.
func readSmall(file string) ([]byte, error) {
	fd, err := unix.Open(file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: file, Err: err}
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, 4096)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: file, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// keyValue finds the "key value" line of a cgroup file's content.
func keyValue(b []byte, key string) (uint64, error) {
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
		if ok && k == key {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %q", key)
}

// Procs returns the pids in the group (read from the freezer or pids v1
// hierarchy, or v2).
func (g *Group) Procs() ([]int, error) {
	dir := g.v2
	for _, c := range []string{"freezer", "pids", "memory"} {
		if g.v1[c] != "" {
			dir = g.v1[c]
			break
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("cgroup %s: procs: %w", g.id, err)
	}
	return parsePids(b), nil
}

// parsePids parses a cgroup.procs.
func parsePids(b []byte) []int {
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids
}

// Kill sends SIGKILL to every process in the group. A frozen group is thawed
// so that the kill takes effect (v1 frozen tasks do not die).
func (g *Group) Kill(ctx context.Context) error {
	if g.v2 != "" {
		err := write(g.v2, "cgroup.kill", "1")
		if err == nil || errors.Is(err, os.ErrNotExist) && !g.Exists() {
			return g.Thaw(ctx)
		}
	}
	pids, err := g.Procs()
	if err != nil {
		return err
	}
	for _, p := range pids {
		_ = unix.Kill(p, unix.SIGKILL)
	}
	return g.Thaw(ctx)
}

// Remove waits until the group is empty (kill it first) and removes every
// directory. Missing directories are not an error.
func (g *Group) Remove(ctx context.Context) error {
	for _, d := range g.allDirs() {
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) {
				return fmt.Errorf("cgroup %s: remove %s: %w", g.id, d, err)
			}
			if err := pause(ctx, fmt.Sprintf("cgroup %s: remove %s: still busy", g.id, d)); err != nil {
				return err
			}
		}
	}
	return nil
}

// pause waits a moment between polls of kernel state that has no event.
func pause(ctx context.Context, what string) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", what, ctx.Err())
	case <-time.After(time.Millisecond):
		return nil
	}
}

// PidsLimitHits returns how often a fork failed on the pids limit.
func (g *Group) PidsLimitHits() (uint64, error) {
	dir := g.v1["pids"]
	if g.unified {
		dir = g.v2
	}
	return readKey(filepath.Join(dir, "pids.events"), "max")
}
