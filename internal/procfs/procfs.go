// Package procfs walks the host's process table in /proc: the one walk of
// it in corral (the VMM sweep, benchmarks, leak checks in tests). It
// imports nothing from corral.
package procfs

import (
	"iter"
	"os"
	"strconv"
	"strings"
)

// PIDs yields the pid of every process in /proc. A process may end while
// it is yielded: reads of its files then fail, and callers skip it.
func PIDs() iter.Seq[int] {
	return func(yield func(int) bool) {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if !yield(pid) {
				return
			}
		}
	}
}

// Cmdlines yields each process's pid and argv, from its cmdline. Kernel
// threads, zombies and processes that ended meanwhile have none and are
// left out.
func Cmdlines() iter.Seq2[int, []string] {
	return func(yield func(int, []string) bool) {
		for pid := range PIDs() {
			b, err := os.ReadFile(Path(pid, "cmdline"))
			if err != nil || len(b) == 0 {
				continue
			}
			if !yield(pid, strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")) {
				return
			}
		}
	}
}

// Path is the file name of process pid in /proc, e.g. Path(1, "cgroup").
func Path(pid int, name string) string {
	return "/proc/" + strconv.Itoa(pid) + "/" + name
}
