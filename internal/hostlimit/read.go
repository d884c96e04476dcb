package hostlimit

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// procRoot is where the kernel's figures are read; tests point it at a
// fake tree.
var procRoot = "/proc"

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a number", path, s)
	}
	return v, nil
}

func writeInt(path string, v int64) error {
	return os.WriteFile(path, []byte(strconv.FormatInt(v, 10)), 0)
}

// tasks is the number of tasks (threads) on the host: the kernel's
// nr_threads, the denominator of /proc/loadavg's fourth field. Each holds
// one PID of the initial PID namespace, whatever namespace it lives in.
func tasks() (int64, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, "loadavg"))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return 0, fmt.Errorf("loadavg: %q has no task count", b)
	}
	_, total, ok := strings.Cut(f[3], "/")
	if !ok {
		return 0, fmt.Errorf("loadavg: %q has no task count", f[3])
	}
	return strconv.ParseInt(total, 10, 64)
}

// memInfo returns MemTotal and MemAvailable in bytes.
func memInfo() (total, avail int64, err error) {
	b, err := os.ReadFile(filepath.Join(procRoot, "meminfo"))
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "MemTotal":
			dst = &total
		case "MemAvailable":
			dst = &avail
		default:
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("meminfo %s: %w", k, err)
		}
		*dst = n << 10
	}
	if total == 0 {
		return 0, 0, fmt.Errorf("meminfo: no MemTotal")
	}
	return total, avail, nil
}

// openFds counts the daemon's open file descriptors.
func openFds() (int64, error) {
	d, err := os.Open(filepath.Join(procRoot, "self/fd"))
	if err != nil {
		return 0, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0, err
	}
	return int64(len(names)) - 1, nil // less the directory's own fd
}

// ownThreads is the daemon's thread count.
func ownThreads() (int64, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, "self/status"))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no Threads in %s/self/status", procRoot)
}

// loopLimit is how many loop devices the kernel can number: 2^20 minors
// divided among each device's partitions (max_part).
func loopLimit() int64 {
	parts, err := readInt("/sys/module/loop/parameters/max_part")
	shift := 0
	for err == nil && (1<<shift) < parts+1 {
		shift++
	}
	return (1 << 20) >> shift
}

// loopsBound counts the loop devices with a backing file.
func loopsBound() (int64, error) {
	ents, err := os.ReadDir("/sys/block")
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		if _, err := os.Stat(filepath.Join("/sys/block", e.Name(), "loop/backing_file")); err == nil {
			n++
		}
	}
	return n, nil
}

// statfs returns the size and use of dir's filesystem in bytes and inodes
// (free as seen by root: the daemon writes as root).
func statfs(dir string) (bytes, usedBytes, inodes, usedInodes int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, 0, 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	bs := int64(st.Bsize)
	return int64(st.Blocks) * bs, int64(st.Blocks-st.Bfree) * bs, int64(st.Files), int64(st.Files - st.Ffree), nil
}
